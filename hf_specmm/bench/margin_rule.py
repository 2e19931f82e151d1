"""The margin rule of the bench presets (:func:`apply_margin_rule`): why it exists and how it is checked is
in :mod:`hf_specmm.bench.margins`. It sits below the presets, which apply it, and the margin check, which
builds presets."""

from __future__ import annotations

from typing import Any

import torch

EMBED_RATIO = 8.0  # token embedding norm / norm of everything the layers add to the residual stream
TOP_LOGIT = 20.0  # about the winning logit; the runner-up trails by ~9 logits at hidden 64, ~16-18 at 1024-4096


@torch.no_grad()
def _layer_sum_norm(decoder: Any, probe: torch.Tensor) -> float:
    """The largest norm of what the layers add to the residual stream (final-norm input minus embedding)."""
    seen: dict[str, torch.Tensor] = {}
    hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
    try:
        decoder(input_ids=probe, use_cache=False)
    finally:
        hook.remove()
    rest = seen["x"].float() - decoder.embed_tokens(probe).float()
    return rest.norm(dim=-1).max().item()


@torch.no_grad()
def apply_margin_rule(model: Any, text_vocab: int, seed: int = 0, first_text_id: int = 3) -> Any:
    """Give ``model`` (a VLM or causal LM with an untied LM head) greedy margins far above bf16 rounding,
    in place; returns ``model``.

    Every id ``x`` gets a successor ``next(x)`` among the ordinary text ids ``[first_text_id, text_vocab)``
    (a random permutation of them; other ids, e.g. ``<image>`` or pads, map to a random text id), so greedy
    runs never emit a special, reserved or end-of-sequence id. Embeddings become random directions of
    norm ``EMBED_RATIO`` times the layers' contribution; ``lm_head[r]`` is the sum of the unit embeddings
    of ``r``'s predecessors, scaled so the winner's logit is about :data:`TOP_LOGIT`.
    """
    from ..testing.shaping import language_model  # the fixtures load with the presets that use them, not before

    decoder = language_model(model)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embed.data_ptr() == head.data_ptr():
        raise ValueError("apply_margin_rule needs an untied LM head (tie_word_embeddings=False)")
    vocab, hidden = head.shape
    if not 0 <= first_text_id < text_vocab <= vocab:
        raise ValueError(f"text ids [{first_text_id}, {text_vocab}) must lie inside the {vocab}-row LM head")
    gen = torch.Generator(device=embed.device).manual_seed(seed)
    directions = torch.randn(embed.shape[0], hidden, generator=gen, device=embed.device)
    directions /= directions.norm(dim=-1, keepdim=True)
    probe = torch.randint(first_text_id, text_vocab, (2, 16), generator=gen, device=embed.device)
    scale = 0.0
    for _ in range(4):  # the layers' contribution barely depends on the embedding's scale (every layer normalises)
        needed = EMBED_RATIO * _layer_sum_norm(decoder, probe)
        if needed <= scale:
            break
        scale = 1.05 * needed
        embed.copy_(directions * scale)
    cpu = torch.Generator().manual_seed(seed + 1)
    text = torch.arange(first_text_id, text_vocab)
    successor = torch.randint(first_text_id, text_vocab, (embed.shape[0],), generator=cpu)
    successor[text] = text[torch.randperm(len(text), generator=cpu)]
    rows = torch.zeros(vocab, hidden, device=head.device)
    # after the final RMSNorm the hidden state has norm ~sqrt(hidden) and points along the last token's embedding
    rows.index_add_(0, successor[: embed.shape[0]].to(head.device), directions * (TOP_LOGIT / hidden ** 0.5))
    head.copy_(rows)
    return model
