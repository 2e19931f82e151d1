"""``LMDrafter``: a causal LM drafting one token per forward on its own KV cache (chains and trees).

No ``draft.generate()`` call per round: the drafter owns the draft's cache and the target tokens it has not
read yet; :class:`~hf_specmm.drafter.Drafter` runs the round (read those pending tokens, propose
γ tokens or a tree, crop back to the accepted prefix after verification: never a re-prefill). Draft kinds
built on a causal LM (text-only, image-adapter, same-family VLM) differ only in :meth:`LMDrafter.draft_inputs`:
what the draft reads of the prompt.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ..caches import mask_to
from ..devices import execution_device
from ..drafter import Drafter, DraftPrompt, Prompt, Proposal
from ..targets.positions import ROPE_1D, PositionRule
from ..vocab import VocabMap

if TYPE_CHECKING:
    from ..caches import CacheFactory


class LMDrafter(Drafter):
    """Base of the KV-cached LM drafters. ``model`` is the module run each step (``draft`` unwrapped). Its
    ``pending`` slots are ``(ids [A, k], valid [A, k])``: the target tokens its cache has not read yet, mapped to
    what the draft reads (unreadable ids as the stand-in). Not the loop's ``cur``: it holds ``cur`` after whatever
    else the cache still lacks (the previous tokens of plain target steps, a kept draft it never read), and in
    the draft's ids."""

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: PositionRule = ROPE_1D):
        super().__init__(draft, vocab, model, positions)
        self.device = execution_device(self.model)  # a dispatched draft's weights may sit on meta (offloaded)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

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
        ids = self.vocab.readable(tokens[:, None])
        self.pending = (ids, torch.ones_like(ids, dtype=torch.bool))

    def follow(self, next_tokens: torch.Tensor) -> None:
        assert self.pending is not None
        ids, valid = self.pending
        tokens = self.vocab.readable(next_tokens[:, None])
        self.pending = (torch.cat([ids, tokens], dim=1), torch.cat([valid, torch.ones_like(tokens, dtype=torch.bool)], 1))

    @property
    def reads_last_draft(self) -> bool:
        # a draft with linear-attention layers reads d_γ in its own round: next round's pending block would
        # otherwise hold a hole in the rows that rejected it, and a hole advances such a draft's states (see
        # hf_specmm.caches.linear)
        return self.state is not None and self.state.linear is not None

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        assert self.pending is not None
        ids, valid = self.pending
        return self.forward(ids, None if bool(valid.all()) else valid)

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        return self.forward(token[:, None], None)

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        return self.forward(self.vocab.readable(tokens), None, position_ids, mask=attention_mask, keep=tokens.shape[1])

    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """``next_tokens``, after the last kept draft where it was kept unread (a chain's d_γ, a tree's leaf)."""
        self._queue(next_tokens)
        if bool(unread.any()):  # read it first next round
            ids, valid = self.pending
            last = proposal.drafts_on_path(path).gather(1, (keep - 1).clamp_min(0)[:, None])
            last = self.vocab.readable(last).masked_fill(~unread[:, None], 0)
            self.pending = (torch.cat([last, ids], dim=1), torch.cat([unread[:, None], valid], dim=1))
