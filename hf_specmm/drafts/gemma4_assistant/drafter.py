"""Runs a Gemma 4 assistant (``Gemma4AssistantForCausalLM`` / ``Gemma4UnifiedAssistantForCausalLM``) in the
speculative loop, at any batch size, as chains or trees, on dynamic and static caches.

The assistant has no cache and no prompt of its own: every one of its layers attends to the K/V of the
target's producer layer of its type (the layer its config marks "store": the K/V the target's own KV-sharing
layers reuse, or, with none, the last layer of that type's). Each draft step reads
``[target embedding of the last token ; a hidden state]`` at ONE fixed position, the last token's, as stock's
``SinglePositionMultiTokenCandidateGenerator`` does:

- the round's first step reads the last token (the target's first / correction / bonus token, not yet read
  by the target) with the target's final hidden state at the last accepted position (captured by a hook on
  the target's decoder during its own prefill and verification forwards: no second target pass);
- step j + 1 reads d_j with the assistant's own projected hidden state of step j.

The K/V is read from the target's cache after the loop's rollback (:meth:`Drafter.observe_target_cache`):
exactly the slots each row kept, whatever the batch's per-row lengths, left padding, holes, tree paths or
cache backend. Each row attends to its valid slots (the slot mask); sliding layers to those within the
window before its position (as stock's mask: the last ``sliding_window + 1`` positions). The position is
the row's own (its count of valid slots), not stock's ``input_ids.shape[1] - 1`` for every row.

Where this differs from stock at batch 1: after a rejection stock cuts the target's K/V to
``input_ids.shape[1]`` slots, one past the accepted ones, so the assistant also sees the K/V of the rejected
draft (at the position of the token that replaced it); here it sees only what the target accepted.

Sampling: d_j is drawn from q_j (the assistant's processed distribution) and verified against that q_j
(stock drafts the argmax but verifies against the softmax, which is biased; see docs/draft-kinds.md).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ... import _compat
from ...caches import CacheFactory, SlottedCache
from ...devices import execution_device
from ...drafter import Drafter, LevelReader, Prompt, Proposal, every_prompt_position
from ...errors import IncompatibleDraftError
from ...hooks import this_call
from ...trees import TreeShape
from ...vocab import VocabMap
from .modeling import assistant_step, check_target, is_gemma4_assistant


class Gemma4AssistantDrafter(Drafter):
    """A :class:`~hf_specmm.drafter.Drafter` with no ``state`` of its own (its context is the target's cache, read
    after the loop's rollback: nothing to roll back here); ``pending`` is the target's hidden state at each row's
    last accepted token ([A, 1, H], valid [A, 1]), read with the token after it (the loop's ``cur``)."""

    observes_prefill = True
    observes_verification = True
    keeps_read_drafts = False

    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab)
        own = draft.config.get_text_config()
        self.device = execution_device(draft)
        self.layer_types = set(own.layer_types)
        self.window = int(own.sliding_window) if "sliding_attention" in self.layer_types else None
        self.target: Any = None
        self.target_kv: SlottedCache | None = None
        self.producers: dict[str, int] = {}
        self.captured: torch.Tensor | None = None  # [B, L, H] the target decoder's last output
        self.verified: torch.Tensor | None = None
        self.prompt_hidden: torch.Tensor | None = None  # [B, H] the target's hidden state at the prompt's last token
        self.round: tuple[dict, dict, torch.Tensor] | None = None  # the round's view of the target's K/V
        self.level_hidden: torch.Tensor | None = None  # [A, K, H] the assistant's projected states of the last read
        self.read = 0  # steps read this round

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        if not is_gemma4_assistant(draft):
            raise IncompatibleDraftError(
                f"a gemma4_assistant draft must be a Gemma 4 assistant, got {type(draft).__name__}")
        check_target(target, draft)

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The assistant attends to every prompt slot the target keeps (image positions included)."""
        return every_prompt_position(input_ids, attention_mask)

    # ---- what the target's own forwards hold -----------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, target: Any) -> Iterator[None]:
        """Capture the target decoder's output (its final norm's: stock's ``hidden_states[-1]``)."""
        self.target = target

        def on_done(module: Any, args: tuple, output: Any) -> None:
            self.captured = output[0].detach()

        handle = target.get_decoder().register_forward_hook(this_call(on_done))
        try:
            yield
        finally:
            handle.remove()

    def _take(self) -> torch.Tensor:
        if self.captured is None:
            raise RuntimeError("the target's last hidden states were not captured for the Gemma 4 assistant")
        captured, self.captured = self.captured, None
        return captured

    def observe_prefill(self, target_outputs: Any) -> None:
        self.prompt_hidden = self._take()[:, -1]  # left-padded prompts: every row's last token is the last column

    def observe_verification(self, target_outputs: Any) -> None:
        self.verified = self._take()

    def observe_target_cache(self, cache: SlottedCache) -> None:
        self.target_kv = cache
        self.producers = _compat.shared_kv_producers(self.target.config.get_text_config())

    # ---- the round --------------------------------------------------------------------------------------
    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor, new_cache: CacheFactory) -> None:
        """Nothing to read: the target's cache and last hidden state are the assistant's whole context."""
        if self.target_kv is None:
            raise RuntimeError("the Gemma 4 assistant needs the target's cache (Drafter.observe_target_cache)")
        hidden, self.prompt_hidden = self.prompt_hidden, None
        self.pending = (hidden[:, None], torch.ones_like(first_tokens[:, None], dtype=torch.bool))

    def _context(self, queries: int) -> tuple[dict, dict, torch.Tensor]:
        """The target's shared K/V as each row kept it, the additive masks [B, 1, queries, S] per layer type and
        each row's position [B, queries] (the last token's)."""
        kv = self.target_kv
        dtype = self.model.dtype
        shared = {name: tuple(t.to(self.device, dtype) for t in _compat.cache_layer_states(kv.cache, index, kv.length))
                  for name, index in self.producers.items() if name in self.layer_types}
        valid = torch.ones(kv.batch_size, kv.length, dtype=torch.long, device=kv.device) if kv.mask is None else kv.mask
        slot_positions = valid.cumsum(-1) - 1
        position = valid.sum(-1)  # the last token's: the count of valid slots before it
        low = torch.finfo(dtype).min

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, low)
            return mask[:, None, None].expand(-1, 1, queries, -1).to(self.device)

        seen = valid.bool()
        masks = {"full_attention": additive(seen)}
        if self.window is not None:
            masks["sliding_attention"] = additive(seen & (slot_positions >= position[:, None] - 1 - self.window))
        return shared, masks, position[:, None].expand(-1, queries).to(self.device)

    def _step(self, context: tuple[dict, dict, torch.Tensor], tokens: torch.Tensor, hidden: torch.Tensor,
              depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One assistant forward over Q queries per row (``tokens`` [B, Q], ``hidden`` [B, Q, H]; ``depth``: their
        steps after the round's root): target-vocabulary logits [B, Q, V] (float32, loop device) and the assistant's
        projected hidden states [B, Q, H]."""
        shared, masks, position = context
        embed = self.target.get_input_embeddings()
        embeds = torch.cat([embed(tokens.to(embed.weight.device)).to(hidden.device), hidden], -1)
        logits, projected = assistant_step(self.model, embeds.to(self.device, self.model.dtype), position, shared,
                                           masks)
        logits = self.vocab.to_target(logits.to(device=tokens.device, dtype=torch.float32))
        override = getattr(self.model, "override_step_logits", None)  # the bench's controlled acceptance
        if callable(override):  # the tokens read sit at the root's position + depth (the assistant's is the root's)
            logits = override(logits, position.to(logits.device) + depth)
        return logits, projected

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        """The round's first step: the root ``cur`` (the last token) with the target's hidden state before it."""
        assert self.pending is not None
        self.round, self.read = self._context(1), 0
        logits, self.level_hidden = self._step(self.round, cur[:, None], self.pending[0].to(self.device), 0)
        return logits[:, 0]

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """d_j with the assistant's own projected hidden state of the step before."""
        self.read += 1
        logits, self.level_hidden = self._step(self.round, token[:, None], self.level_hidden, self.read)
        return logits[:, 0]

    def tree_levels(self, shape: TreeShape) -> LevelReader:
        """Level d's K frontier nodes in ONE forward (K queries at the same position, each reading its token and
        its parent's projected hidden state; the queries do not see each other, as a chain's steps do not)."""
        context = self._context(shape.top_k)

        def read(tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
            before = self.level_hidden
            index = parents.clamp_min(0).to(before.device)[..., None].expand(-1, -1, before.shape[-1])
            logits, self.level_hidden = self._step(context, tokens, before.gather(1, index), depth)
            return logits

        return read

    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """The target's hidden state at each row's last kept block position (a tree's: its kept path's last node)."""
        assert self.verified is not None
        verified, self.verified, self.round, self.level_hidden = self.verified.to(keep.device), None, None, None
        index = keep if path is None else path.to(keep.device).gather(1, keep[:, None])[:, 0]
        hidden = verified[torch.arange(keep.shape[0], device=keep.device), index]
        self.pending = (hidden[:, None], torch.ones_like(keep[:, None], dtype=torch.bool))

    def follow(self, next_tokens: torch.Tensor) -> None:
        """A plain target step read ``[cur]`` alone: its hidden state and the target's next token."""
        assert self.verified is not None
        hidden, self.verified = self.verified[:, -1], None
        self.pending = (hidden[:, None], torch.ones_like(next_tokens[:, None], dtype=torch.bool))
