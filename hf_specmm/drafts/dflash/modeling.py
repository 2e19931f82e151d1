"""DFlash block drafters (arXiv 2602.06036) as transformers ships them: ``MuseGlimmerAssistantModel`` (5.17+)
and any model of that architecture. Nothing is copied here: the drafter runs the class as it is; this module
says which models are DFlash drafters, checks one against a target before any work, reads the target's
embedding and LM head the way stock's ``DFlashTokenCandidateGenerator`` does, and builds fresh ones.

A DFlash drafter has no embedding and no LM head of its own (no ``vocab_size`` in its config): it embeds the
anchor token and its ``mask_token_id`` block with the target's embedding table, reads the target's hidden
states after layers ``target_layer_ids`` (``hidden_states[i + 1]``: -1 reads index 0, the embedding output) as the
context its keys and values are computed from, and scores its block with the target's LM head.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from ...errors import IncompatibleDraftError

#: the DFlash drafter classes of the installed transformers
DFLASH_CLASSES: tuple[type, ...] = tuple(
    getattr(transformers, name) for name in ("MuseGlimmerAssistantModel",) if hasattr(transformers, name))
_CONFIG_KEYS = ("block_size", "mask_token_id", "target_layer_ids")
#: the largest block a DFlash drafter may read per round (published drafters read 10 or 16); its logits are
#: [batch, block_size - 1, vocabulary] floats each round
MAX_BLOCK_SIZE = 64


def is_dflash_draft(draft: Any) -> bool:
    """A DFlash block drafter: a class of :data:`DFLASH_CLASSES` (its config has a block size, a mask token
    and the target layers it reads)."""
    return isinstance(draft, DFLASH_CLASSES)


def target_text_config(target: Any) -> Any:
    return target.config.get_text_config()


def check_target(target: Any, draft: Any) -> None:
    """Raise :class:`IncompatibleDraftError` unless ``draft`` can draft for ``target`` (before any forward)."""
    config, text = draft.config, target_text_config(target)
    missing = [key for key in _CONFIG_KEYS if getattr(config, key, None) is None]
    if missing:
        raise IncompatibleDraftError(f"{type(draft).__name__}'s config has no {', '.join(missing)}: a DFlash drafter "
                                     "needs block_size, mask_token_id and target_layer_ids.")
    layers = text.num_hidden_layers
    bad = [i for i in config.target_layer_ids if not -1 <= i < layers]  # -1: the embedding output (hidden_states[0])
    if bad:
        raise IncompatibleDraftError(f"The DFlash drafter reads target layers {list(config.target_layer_ids)} "
                                     f"(target_layer_ids), but "
                                     f"{type(target).__name__} has {layers} decoder layers ({bad} out of range): it was "
                                     "made for another target.")
    if config.hidden_size != text.hidden_size:
        raise IncompatibleDraftError(f"The DFlash drafter's hidden size (hidden_size {config.hidden_size}) is not the "
                                     f"target's ({text.hidden_size}): it was made for another target.")
    if target.get_input_embeddings() is None or target.get_output_embeddings() is None:
        raise IncompatibleDraftError(f"{type(target).__name__} exposes no input embedding / LM head for a DFlash "
                                     "drafter to embed and score with.")
    rows = target.get_input_embeddings().weight.shape[0]
    if not 0 <= config.mask_token_id < rows:
        raise IncompatibleDraftError(f"The DFlash drafter's mask_token_id ({config.mask_token_id}) is outside the "
                                     f"target's embedding table ({rows} rows): it was made for another tokenizer.")
    d2t = getattr(draft, "d2t", None)
    if d2t is not None and not d2t.is_meta:  # a reduced vocabulary's map (extended.SpeculatorsDFlashModel), loaded
        from ..feature_head.validation import check_vocab_maps

        check_vocab_maps(d2t, draft.t2d, "The DFlash drafter's draft vocabulary", vocab=target_vocab_size(draft, target),
                         error=IncompatibleDraftError)
    if not 2 <= config.block_size <= MAX_BLOCK_SIZE:
        raise IncompatibleDraftError(f"The DFlash drafter's block_size is {config.block_size}: it proposes "
                                     f"block_size - 1 tokens per round, so it needs 2..{MAX_BLOCK_SIZE}.")


def check_dflash_config(raw: dict[str, Any], source: str) -> None:
    """A DFlash drafter's config.json (read as data): ``block_size`` an integer in 2..:data:`MAX_BLOCK_SIZE`,
    ``mask_token_id`` an integer >= 0, ``target_layer_ids`` a non-empty list of integers >= -1 (-1: the embedding output)."""
    if raw.get("model_type") not in {cls.config_class.model_type for cls in DFLASH_CLASSES}:
        return
    from ..feature_head.validation import checked_int, checked_int_list

    checked_int(raw.get("block_size"), "block_size", source, low=2, high=MAX_BLOCK_SIZE)
    checked_int(raw.get("mask_token_id"), "mask_token_id", source, low=0)
    checked_int_list(raw.get("target_layer_ids"), "target_layer_ids", source, low=-1)


def target_vocab_size(draft: Any, target: Any) -> int:
    """The vocabulary a DFlash drafter proposes from: the target's LM head rows (it scores with that head)."""
    return int(target.get_output_embeddings().weight.shape[0])


def embed_block(target: Any, ids: torch.Tensor) -> torch.Tensor:
    """The target's token embeddings of ``ids`` without the optional ``embed_norm`` some embeddings apply
    (stock's ``DFlashTokenCandidateGenerator._get_noise_embeds`` bypasses it the same way)."""
    table = target.get_input_embeddings()
    norm = getattr(table, "embed_norm", None)
    if norm is None:
        return table(ids)
    table.embed_norm = torch.nn.Identity()
    try:
        return table(ids)
    finally:
        table.embed_norm = norm


def default_mask_token(target: Any) -> int:
    """The target's pad id if its embedding row is not zero, else the first id whose row is not (LLaMA-style
    vocabularies: ``<unk>``). A zero row (``nn.Embedding(padding_idx=pad)`` keeps the pad row at 0) would make
    every mask position's query and residual 0 in the drafter's first layer: uniform attention, the same output
    at every block position (a one-layer drafter trained on the world with the pad id as mask plateaued at 0.2
    top-1 at block position 1)."""
    table = target.get_input_embeddings().weight.detach()
    pad = getattr(target_text_config(target), "pad_token_id", None)
    if pad is not None and 0 <= pad < table.shape[0] and bool(table[pad].any()):
        return int(pad)
    nonzero = table.any(-1).nonzero()
    return int(nonzero[0, 0]) if len(nonzero) else 0


def dflash_config_for(target: Any, block_size: int = 8, target_layer_ids: list[int] | None = None,
                      num_layers: int = 1, mask_token_id: int | None = None, sliding_window: int | None = None,
                      config_class: type | None = None) -> Any:
    """A ``MuseGlimmerAssistantConfig`` for a fresh DFlash drafter of ``target``: the target's width, heads and
    RoPE base; ``target_layer_ids`` spread over the target's layers by default (first, middle, last, as the
    paper's); ``mask_token_id`` an id of the target's vocabulary (default: :func:`default_mask_token`)."""
    if config_class is None:
        if not DFLASH_CLASSES:
            raise ImportError("this transformers has no DFlash drafter class (MuseGlimmerAssistantModel, 5.17+)")
        config_class = DFLASH_CLASSES[0].config_class
    text = target_text_config(target)
    layers = text.num_hidden_layers
    text, rope = _first_layer_config(text)
    if target_layer_ids is None:
        target_layer_ids = sorted({1 if layers > 2 else 0, layers // 2, layers - 2 if layers > 2 else layers - 1})
    if mask_token_id is None:
        mask_token_id = default_mask_token(target)
    heads = text.num_attention_heads
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return config_class(
        hidden_size=text.hidden_size, intermediate_size=text.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=getattr(text, "num_key_value_heads", heads) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": float(theta or 10000.0)},
        max_position_embeddings=getattr(text, "max_position_embeddings", 4096),
        sliding_window=sliding_window or 2048,
        layer_types=["sliding_attention" if sliding_window else "full_attention"] * num_layers,
        block_size=block_size, mask_token_id=int(mask_token_id), target_layer_ids=list(target_layer_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def _first_layer_config(text: Any) -> tuple[Any, Any]:
    """(the config the drafter's shapes are read from, its RoPE parameters). A text config with per-layer shapes
    (Gemma 4: heads and head size differ by layer type, and reading them globally is refused) gives those of its
    first layer, and the RoPE parameters of that layer's type."""
    rope = getattr(text, "rope_parameters", None) or {}
    per_layer = getattr(text, "per_layer_config", None)
    if per_layer is None:
        return text, rope
    kind = (getattr(text, "layer_types", None) or [None])[0]
    if isinstance(rope, dict) and isinstance(rope.get(kind), dict):
        rope = rope[kind]
    return per_layer[0], rope


def dflash_draft_for(target: Any, seed: int = 0, **config_kwargs: Any) -> Any:
    """A fresh (randomly initialised) DFlash drafter for ``target`` (:func:`dflash_config_for`'s arguments)."""
    config = dflash_config_for(target, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DFLASH_CLASSES[0](config).to(target.dtype).eval()
