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
from typing import TYPE_CHECKING, Any

import torch

from ..budget import RoundBudget
from ..caches import SlottedCache
from ..devices import execution_device
from ..drafter import Drafter, DraftPrompt, Prompt, Proposal
from ..targets.positions import ROPE_1D, Rope1D
from ..vocab import VocabMap

if TYPE_CHECKING:
    from ..caches import CacheFactory
    from ..selector import Selector


class ChainDrafter(Drafter):
    """Base of the KV-cached LM drafters. ``model`` is the module run each step (``draft`` unwrapped)."""

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: Rope1D = ROPE_1D):
        super().__init__(draft, vocab, model, positions)
        self.device = execution_device(self.model)  # a dispatched draft's weights may sit on meta (offloaded)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.state: SlottedCache | None = None
        self.pending: torch.Tensor | None = None  # [B, k] target ids the draft has not read yet
        self.pending_valid: torch.Tensor | None = None  # [B, k] which of them it reads

    @abstractmethod
    def draft_inputs(self, prompt: Prompt) -> DraftPrompt:
        """The draft's prompt (ids, valid slots, bound positions, extra forward kwargs). Training runs the
        same method on its teacher-forced batches, so what is trained is what runs."""

    def forward(self, ids: torch.Tensor, valid: torch.Tensor | None, position_ids: torch.Tensor | None = None,
                **extra: Any) -> torch.Tensor:
        """Feed ``ids`` [B, k] into the draft cache and return target-vocabulary logits of the last position
        (``position_ids``: given for the prompt, else the position rule's block positions)."""
        assert self.state is not None
        inputs = self.state.append(valid, ids.shape[1], position_ids)
        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=None if inputs["attention_mask"] is None else inputs["attention_mask"].to(self.device),
            position_ids=inputs["position_ids"].to(self.device),
            **self.state.forward_kwargs(),
            use_cache=True,
            **kwargs,
            **extra,
        )
        # back on the loop's (target input) device: a draft may live on another device than the target
        return self.vocab.to_target(out.logits[:, -1].to(device=ids.device, dtype=torch.float32))

    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor, new_cache: "CacheFactory") -> None:
        view = self.draft_inputs(prompt)
        self.positions = view.positions  # bound to this prompt (M-RoPE grids)
        self.state = new_cache(self.model, view.ids.shape[0], view.ids.device, view.positions)
        valid = None if bool(view.valid.all()) else view.valid
        self.forward(view.ids, valid, view.positions.prompt_positions(view.valid.long()), **view.extra)
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

    def propose(self, budget: RoundBudget, select: "Selector") -> Proposal:
        gamma = budget.gamma
        assert self.pending is not None and self.state is not None and gamma >= 1
        restore = (self.state.length, self.pending.shape[1])  # cache length at round start, pending width
        logits = self.forward(self.pending, None if bool(self.pending_valid.all()) else self.pending_valid)
        tokens, probs = [], []
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                break
            if j + 1 < gamma:  # d_γ is read next round, only if accepted
                logits = self.forward(token[:, None], None)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, restore)

    def accept(self, proposal: Proposal, n: torch.Tensor, next_tokens: torch.Tensor) -> None:
        assert self.state is not None
        start, width = proposal.restore
        # keep the pending slots (as valid as they were) and the accepted drafts that were read (d_1..d_{γ-1})
        self.state.rollback(start, width + n.clamp_max(proposal.gamma - 1))
        self._queue(next_tokens)
        full = n == proposal.gamma  # d_γ was accepted but never read: read it first next round
        if bool(full.any()):
            last = proposal.tokens[:, -1:].masked_fill(~full[:, None], 0)
            self.pending = torch.cat([last, self.pending], dim=1)
            self.pending_valid = torch.cat([full[:, None], self.pending_valid], dim=1)
