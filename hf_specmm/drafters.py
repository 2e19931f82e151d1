"""Drafters: run a draft model inside the speculative loop, keeping its KV cache across rounds.

A drafter owns the draft's cache and the tokens it has not read yet. Each round it reads those
pending tokens, proposes γ tokens (one forward per token, no ``draft.generate()`` call), and after
verification rolls its cache back to the accepted prefix. The steps are small methods so that other
draft kinds (e.g. one that also reads the target's image features) override only what differs.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ContextManager

import torch

from . import _compat
from .cache_state import SlottedCache
from .vocab import VocabMap

# picks d_j from target-vocabulary draft logits [B, V]; returns (tokens [B], probabilities [B, V] or None)
SelectFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, "torch.Tensor | None"]]


def text_only_view(vocab: VocabMap, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A text-only draft's prompt: each row's visible tokens (placeholders removed), left-padded.
    Returns ``(ids, valid)``, both [B, width]."""
    visible = vocab.visible_prompt(input_ids, attention_mask)
    width = max(int(visible.sum(-1).max()), 1)
    order = torch.sort(visible.long(), dim=1, stable=True).indices  # hidden slots first, order kept
    ids = input_ids.gather(1, order)[:, -width:]
    valid = visible.gather(1, order)[:, -width:]
    return ids.masked_fill(~valid, 0), valid


class TextOnlyDrafter:
    """Drafts with a causal LM that reads the conversation with image placeholders removed (2404.08856)."""

    def __init__(self, draft: Any, vocab: VocabMap):
        self.draft = draft
        self.vocab = vocab
        self.device = draft.device
        self._keeps_logits = "logits_to_keep" in inspect.signature(draft.forward).parameters
        self.state: SlottedCache | None = None
        self.pending: torch.Tensor | None = None  # [B, k] target ids the draft has not read yet
        self.pending_valid: torch.Tensor | None = None  # [B, k] which of them it reads

    # ---- steps -------------------------------------------------------------------------------------
    def observe_target(self, target: Any) -> ContextManager:
        """Context entered while the target runs its prefill (a text-only draft needs nothing from it)."""
        return contextlib.nullcontext()

    def prompt_view(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return text_only_view(self.vocab, input_ids, attention_mask)

    def forward(self, ids: torch.Tensor, valid: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        """Feed ``ids`` [B, k] into the draft cache and return target-vocabulary logits of the last position."""
        assert self.state is not None
        inputs = self.state.block_inputs(valid, ids.shape[1])
        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = self.draft(
            input_ids=ids.to(self.device),
            attention_mask=None if inputs["attention_mask"] is None else inputs["attention_mask"].to(self.device),
            position_ids=inputs["position_ids"].to(self.device),
            past_key_values=self.state.cache,
            use_cache=True,
            **kwargs,
            **extra,
        )
        self.state.commit(inputs["attention_mask"], ids.shape[1])
        # back on the loop's (target input) device: a draft may live on another device than the target
        return self.vocab.to_target(out.logits[:, -1].to(device=ids.device, dtype=torch.float32))

    def draft_inputs(self, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The draft's prompt ids, which of its slots are valid, and extra forward kwargs (none here)."""
        ids, valid = self.prompt_view(input_ids, attention_mask)
        return ids, valid, {}

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        ids, valid, extra = self.draft_inputs(input_ids, attention_mask)
        batch = ids.shape[0]
        self.state = SlottedCache(_compat.new_dynamic_cache(), None, 0, batch, ids.device)
        self.forward(ids, None if bool(valid.all()) else valid, **extra)

    def push(self, tokens: torch.Tensor) -> None:
        """Queue one new target token per row (read at the start of the next proposal)."""
        tokens = tokens[:, None]
        valid = self.vocab.visible_to_draft(tokens)
        self.pending, self.pending_valid = tokens.masked_fill(~valid, 0), valid

    # ---- one round -------------------------------------------------------------------------------
    def propose(self, gamma: int, select: SelectFn) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft γ tokens: returns ``drafts`` [B, γ] and their probabilities [B, γ, V] (sampling) or None."""
        assert self.pending is not None and self.state is not None
        self._round_start = self.state.length
        valid = None if bool(self.pending_valid.all()) else self.pending_valid
        logits = self.forward(self.pending, valid)
        self._pending_width = self.pending.shape[1]
        tokens, probs = [], []
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if j + 1 < gamma:  # d_γ is read next round, only if accepted
                logits = self.forward(token[:, None], None)
        drafts = torch.stack(tokens, 1)
        return drafts, (torch.stack(probs, 1) if probs[0] is not None else None)

    def accept(self, n: torch.Tensor, drafts: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Roll back to the accepted prefix: ``n`` [B] accepted drafts, ``next_tokens`` [B] correction/bonus."""
        assert self.state is not None
        gamma = drafts.shape[1]
        kept = torch.arange(gamma - 1, device=n.device)[None] < n[:, None]  # d_1..d_{γ-1} read and accepted
        keep_width = int(kept.sum(-1).max()) if gamma > 1 else 0
        start, width = self._round_start, self._pending_width
        if self.state.mask is None:
            pending_valid = torch.ones(n.shape[0], width, dtype=torch.bool, device=n.device)
        else:
            pending_valid = self.state.mask[:, start : start + width].bool()
        self.state.rollback(start, torch.cat([pending_valid, kept[:, :keep_width]], dim=1))
        full = n == gamma  # d_γ was accepted but never read
        self.push(next_tokens)
        if bool(full.any()):
            last = drafts[:, -1:].masked_fill(~full[:, None], 0)
            self.pending = torch.cat([last, self.pending], dim=1)
            self.pending_valid = torch.cat([full[:, None], self.pending_valid], dim=1)
