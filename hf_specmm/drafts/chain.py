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
from ..caches import SlottedCache, mask_to
from ..devices import execution_device
from ..drafter import Drafter, DraftPrompt, Prompt, Proposal
from ..targets.positions import ROPE_1D, Rope1D
from .tree_drafting import TreeDrafting
from ..vocab import VocabMap

if TYPE_CHECKING:
    from ..caches import CacheFactory
    from ..selector import Selector


class ChainDrafter(TreeDrafting, Drafter):
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
                mask: Any = None, keep: int = 1, **extra: Any) -> torch.Tensor:
        """Feed ``ids`` [B, k] into the draft cache and return target-vocabulary logits of the last position
        (``position_ids``: given for the prompt, else the position rule's block positions). A tree level:
        ``mask`` its 4-D mask in place of the cache's 2-D one, ``keep`` positions' logits [B, keep, V]."""
        assert self.state is not None
        inputs = self.state.append(valid, ids.shape[1], position_ids)
        if mask is not None:
            inputs["attention_mask"] = mask
        kwargs = {"logits_to_keep": keep} if self._keeps_logits else {}
        call = self.model if position_ids is not None else self.state.step_call(self.model)  # the prompt: eager
        out = call(
            input_ids=ids.to(self.device),
            attention_mask=mask_to(inputs["attention_mask"], self.device),
            position_ids=inputs["position_ids"].to(self.device),
            **self.state.forward_kwargs(),
            use_cache=True,
            **kwargs,
            **extra,
        )
        # back on the loop's (target input) device: a draft may live on another device than the target
        logits = self.vocab.to_target(out.logits[:, -keep:].to(device=ids.device, dtype=torch.float32))
        return logits[:, -1] if keep == 1 and mask is None else logits

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

    follows_plain_steps = True

    def follow(self, next_tokens: torch.Tensor) -> None:
        assert self.pending is not None and self.pending_valid is not None
        tokens = self.vocab.readable(next_tokens[:, None])
        self.pending = torch.cat([self.pending, tokens], dim=1)
        self.pending_valid = torch.cat([self.pending_valid, torch.ones_like(tokens, dtype=torch.bool)], dim=1)

    selects_rows = True  # a subclass with more per-row state than the cache and the pending tokens extends select_rows

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.state is not None and self.pending is not None and self.pending_valid is not None
        super().select_rows(keep)
        self.state.select_rows(keep)
        keep = keep.to(self.pending.device)
        self.pending, self.pending_valid = self.pending[keep], self.pending_valid[keep]

    def _read_pending(self) -> tuple[torch.Tensor, tuple[int, int]]:
        assert self.pending is not None and self.state is not None and self.pending_valid is not None
        restore = (self.state.length, self.pending.shape[1])  # cache length at round start, pending width
        return self.forward(self.pending, None if bool(self.pending_valid.all()) else self.pending_valid), restore

    def _read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                    position_ids: torch.Tensor) -> torch.Tensor:
        return self.forward(self.vocab.readable(tokens), None, position_ids, mask=attention_mask, keep=tokens.shape[1])

    def propose(self, budget: RoundBudget, select: "Selector") -> Proposal:
        if budget.drafts_tree:
            return self.propose_tree(budget, select)
        gamma = budget.gamma
        assert self.pending is not None and self.state is not None and gamma >= 1
        self.state.reserve(self.pending.shape[1] + gamma)  # room for the round: slot indices stay put
        logits, restore = self._read_pending()
        tokens, probs = [], []
        reads_all = self.state.linear is not None
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                if reads_all:
                    self.forward(token[:, None], None)
                break
            # d_γ is read next round, only if accepted; a draft with linear-attention layers reads it now: next
            # round's pending block would otherwise hold a hole in the rows that rejected it, and a hole
            # advances such a draft's states (see hf_specmm.caches.linear)
            if j + 1 < gamma or reads_all:
                logits = self.forward(token[:, None], None)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, restore)

    def accept(self, proposal: Proposal, n: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        assert self.state is not None
        if proposal.tree is not None:  # keep the accepted path's read slots; its last node may be unread
            unread = self.accept_tree(proposal, n, next_tokens, path)
            last = proposal.tree.tokens.gather(1, path.gather(1, n[:, None]))
        else:
            start, width = proposal.restore
            # keep the pending slots (as valid as they were) and the accepted drafts that were read (d_1..d_{γ-1};
            # every one for a draft with linear-attention layers)
            read = proposal.gamma if self.state.linear is not None else proposal.gamma - 1
            self.state.rollback(start, width + n.clamp_max(read))
            unread, last = n > read, proposal.tokens[:, -1:]  # d_γ was accepted but never read
        self._queue(next_tokens)
        if bool(unread.any()):  # read it first next round
            full = unread
            last = self.vocab.readable(last).masked_fill(~full[:, None], 0)
            self.pending = torch.cat([last, self.pending], dim=1)
            self.pending_valid = torch.cat([full[:, None], self.pending_valid], dim=1)
