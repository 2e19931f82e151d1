"""What the ``gemma4_assistant`` kind knows of stock's Gemma 4 assistants (``Gemma4AssistantForCausalLM``,
``Gemma4UnifiedAssistantForCausalLM``, transformers >= 5.24): which models are one, which targets they can read
(checked before any work), and a tiny one made to fit a target (tests, docs)."""

from __future__ import annotations

from typing import Any

import torch

from ... import _compat
from ...errors import IncompatibleDraftError

#: stock's assistant classes (empty before transformers 5.24)
ASSISTANT_CLASSES: tuple[type, ...] = _compat.gemma4_assistant_classes()


def is_gemma4_assistant(draft: Any) -> bool:
    return bool(ASSISTANT_CLASSES) and isinstance(draft, ASSISTANT_CLASSES)


def assistant_step(assistant: Any, inputs_embeds: torch.Tensor, position_ids: torch.Tensor,
                   shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                   masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``Gemma4AssistantForCausalLM.forward`` with ``masks`` (per layer type, additive [B, 1, Q, S]) in place of the
    ones it builds: (logits [B, Q, V], projected last hidden state [B, Q, backbone hidden])."""
    hidden = assistant.pre_projection(inputs_embeds)
    last = _compat.gemma4_assistant_backbone(assistant, hidden, position_ids, shared_kv, masks)
    if assistant.config.use_ordered_embeddings:
        logits = assistant.masked_embedding(last, assistant.lm_head.weight)
    else:
        logits = assistant.lm_head(last)
    return logits, assistant.post_projection(last)


def _head_shape(config: Any, layer: int) -> tuple[int, int]:
    """(head_dim, key / value heads) of ``layer`` of a Gemma 4 text config (full layers have their own)."""
    per_layer = config.per_layer_config[layer]
    return int(per_layer.head_dim), int(per_layer.num_key_value_heads)


def check_target(target: Any, draft: Any) -> None:
    """Refuse, before any work, a target whose forwards do not hold the K/V the assistant reads: one whose config
    marks no layer to store K/V (``kv_sharing_modes``: a Gemma 4 text config marks the last layer of each type,
    with or without KV-sharing layers), without a producer layer of each of the assistant's layer types, with
    other head shapes, or another hidden size than the assistant's ``backbone_hidden_size``."""
    name = type(target).__name__
    text = target.config.get_text_config()
    producers = _compat.shared_kv_producers(text)
    if not producers:
        raise IncompatibleDraftError(
            f"a Gemma 4 assistant ({type(draft).__name__}) reads the K/V its target stores for it (the layers a "
            f"Gemma 4 text config marks 'store' in kv_sharing_modes), and {name} has none: use it with a Gemma 4 / "
            "Gemma 4 Unified target, or use another draft kind.")
    own = draft.config.get_text_config()
    if int(draft.config.backbone_hidden_size) != int(text.hidden_size):
        raise IncompatibleDraftError(
            f"the Gemma 4 assistant was made for a target of hidden size {draft.config.backbone_hidden_size} "
            f"(backbone_hidden_size) but {name} has {text.hidden_size}: use the assistant released with this target.")
    for layer, layer_type in enumerate(own.layer_types):
        if layer_type not in producers:
            raise IncompatibleDraftError(
                f"the Gemma 4 assistant's layer {layer} attends to the target's {layer_type} K/V, which {name} does "
                f"not share (its shared K/V: {sorted(producers)}): use the assistant released with this target.")
        mine, theirs = _head_shape(own, layer), _head_shape(text, producers[layer_type])
        if mine != theirs:
            raise IncompatibleDraftError(
                f"the Gemma 4 assistant's layer {layer} ({layer_type}) has (head_dim, num_key_value_heads) {mine} but "
                f"{name}'s "
                f"shared {layer_type} K/V has {theirs}: use the assistant released with this target.")
    if own.vocab_size != text.vocab_size:
        raise IncompatibleDraftError(
            f"the Gemma 4 assistant scores {own.vocab_size} ids (text_config.vocab_size) but {name} has "
            f"{text.vocab_size}: use the assistant "
            "released with this target.")
    attention = str(getattr(draft.config, "_attn_implementation", None) or "")
    if "flash" in attention:  # each row reads its own kept slots of the shared K/V through a 4-D additive mask
        raise IncompatibleDraftError(
            f"the Gemma 4 assistant runs with attn_implementation={attention!r}, which takes no per-row 4-D mask (each "
            "row attends to its own kept slots of the shared K/V): load it with attn_implementation='sdpa' or 'eager'.")


def tiny_assistant(target: Any, seed: int = 0, num_layers: int = 2, hidden_size: int = 32) -> Any:
    """A random stock assistant (float32, sdpa) that fits ``target`` (a tiny Gemma 4 / Unified fixture): the
    target's attention shapes and window per layer type, ``num_layers`` layers alternating sliding / full (the
    last full, as Gemma 4 requires), its own hidden size."""
    text = target.config.get_text_config()
    assistant_cls, config_cls = _compat.gemma4_assistant_class_for(target)
    producers = _compat.shared_kv_producers(text)
    (sliding_dim, sliding_heads) = _head_shape(text, producers["sliding_attention"])
    (full_dim, full_heads) = _head_shape(text, producers["full_attention"])
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers - 1)]
    types.append("full_attention")
    own = type(text)(
        vocab_size=text.vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=sliding_heads, head_dim=sliding_dim,
        global_head_dim=full_dim, num_global_key_value_heads=full_heads, attention_k_eq_v=text.attention_k_eq_v,
        num_kv_shared_layers=num_layers, sliding_window=text.sliding_window, layer_types=types,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        max_position_embeddings=text.max_position_embeddings,
        initializer_range=text.initializer_range, pad_token_id=text.pad_token_id, bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id)
    config = config_cls(text_config=own, backbone_hidden_size=text.hidden_size, tie_word_embeddings=True)
    torch.manual_seed(seed)
    draft = assistant_cls._from_config(config, attn_implementation="sdpa").eval()
    draft.generation_config.num_assistant_tokens = 3  # what stock's candidate generator reads (None otherwise)
    return draft
