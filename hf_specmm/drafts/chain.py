"""``ChainDrafter``: a causal LM drafting one token per forward on its own KV cache.

No ``draft.generate()`` call per round: the drafter owns the draft's cache and the target tokens it
has not read yet. Each round it reads those pending tokens, proposes γ tokens, and after verification
crops its cache back to the accepted prefix (never a re-prefill). Draft kinds built on a causal LM
(text-only, image-adapter, same-family VLM) differ only in :meth:`ChainDrafter.draft_inputs`: what
the draft reads of the prompt.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from typing import Any

import torch

from .. import _compat
from ..cache_state import SlottedCache
from ..devices import execution_device
from ..drafter import Drafter, Prompt, Proposal, SelectFn
from ..targets.positions import ROPE_1D, Rope1D
from ..vocab import VocabMap


class ChainDrafter(Drafter):
    """Base of the KV-cached LM drafters. ``model`` is the module run each step (``draft`` unwrapped)."""

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: Rope1D = ROPE_1D):
        super().__init__(draft, vocab)
        self.model = draft if model is None else model
        self.device = execution_device(self.model)  # a dispatched draft's weights may sit on meta (offloaded)
        self.positions = positions
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.state: SlottedCache | None = None
        self.pending: torch.Tensor | None = None  # [B, k] target ids the draft has not read yet
        self.pending_valid: torch.Tensor | None = None  # [B, k] which of them it reads

    @abstractmethod
    def draft_inputs(self, prompt: Prompt) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The draft's prompt: ids [B, W], which slots are valid [B, W] bool, extra forward kwargs.
        Training runs the same method on its teacher-forced batches, so what is trained is what runs."""

    def forward(self, ids: torch.Tensor, valid: torch.Tensor | None, position_ids: torch.Tensor | None = None,
                **extra: Any) -> torch.Tensor:
        """Feed ``ids`` [B, k] into the draft cache and return target-vocabulary logits of the last position
        (``position_ids``: given for the prompt, else the position rule's block positions)."""
        assert self.state is not None
        inputs = self.state.block_inputs(valid, ids.shape[1])
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=None if inputs["attention_mask"] is None else inputs["attention_mask"].to(self.device),
            position_ids=inputs["position_ids"].to(self.device),
            **_compat.cache_kwargs(self.state.cache),
            use_cache=True,
            **kwargs,
            **extra,
        )
        self.state.commit(inputs["attention_mask"], ids.shape[1])
        # back on the loop's (target input) device: a draft may live on another device than the target
        return self.vocab.to_target(out.logits[:, -1].to(device=ids.device, dtype=torch.float32))

    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor) -> None:
        ids, valid, extra = self.draft_inputs(prompt)  # may bind self.positions to this prompt (M-RoPE)
        self.state = SlottedCache(_compat.new_dynamic_cache(), None, 0, ids.shape[0], ids.device, self.positions,
                                  compact=_compat.has_sliding_layers(self.model.config))
        self.forward(ids, None if bool(valid.all()) else valid, self.positions.prompt_positions(valid.long()), **extra)
        self._queue(first_tokens)

    def _queue(self, tokens: torch.Tensor) -> None:
        """One new target token per row, read at the start of the next proposal (as the stand-in if unreadable)."""
        tokens = self.vocab.readable(tokens[:, None])
        self.pending, self.pending_valid = tokens, torch.ones_like(tokens, dtype=torch.bool)

    selects_rows = True  # a subclass with more per-row state than the cache and the pending tokens extends select_rows

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.state is not None and self.pending is not None and self.pending_valid is not None
        super().select_rows(keep)
        self.state.select_rows(keep)
        keep = keep.to(self.pending.device)
        self.pending, self.pending_valid = self.pending[keep], self.pending_valid[keep]

    def propose(self, gamma: int, select: SelectFn) -> Proposal:
        assert self.pending is not None and self.state is not None and gamma >= 1
        restore = (self.state.length, self.pending.shape[1])  # cache length at round start, pending width
        logits = self.forward(self.pending, None if bool(self.pending_valid.all()) else self.pending_valid)
        tokens, probs = [], []
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if getattr(select, "stop", False):  # every row is below the confidence threshold: end the round
                break
            if j + 1 < gamma:  # d_γ is read next round, only if accepted
                logits = self.forward(token[:, None], None)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, restore)

    def accept(self, proposal: Proposal, n: torch.Tensor, next_tokens: torch.Tensor) -> None:
        assert self.state is not None
        start, width = proposal.restore
        gamma = proposal.gamma
        read = torch.arange(gamma - 1, device=n.device)[None] < n[:, None]  # d_1..d_{γ-1} read and accepted
        read_width = int(read.sum(-1).max()) if gamma > 1 else 0
        if self.state.mask is None:
            pending_valid = torch.ones(n.shape[0], width, dtype=torch.bool, device=n.device)
        else:
            pending_valid = self.state.mask[:, start : start + width].bool()
        self.state.rollback(start, torch.cat([pending_valid, read[:, :read_width]], dim=1))
        self._queue(next_tokens)
        full = n == gamma  # d_γ was accepted but never read: read it first next round
        if bool(full.any()):
            last = proposal.tokens[:, -1:].masked_fill(~full[:, None], 0)
            self.pending = torch.cat([last, self.pending], dim=1)
            self.pending_valid = torch.cat([full[:, None], self.pending_valid], dim=1)
