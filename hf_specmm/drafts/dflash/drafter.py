"""Runs a DFlash block drafter in the speculative loop: ONE drafter forward proposes a whole block.

Per round, the drafter reads ``[anchor, mask × (block_size - 1)]`` (the anchor: the target's last token,
not yet read by the target) embedded with the target's embedding table, at the anchor's position onwards;
its queries attend bidirectionally to the block and to the keys / values of every accepted position's
target features (the *context*, :class:`~.context.ContextCache`). The block's positions 1..γ, scored by the
target's LM head, are d_1..d_γ: greedy takes each position's argmax, sampling draws d_j from q_j (processed as
the target's scores are) and the verifier checks it against q_j, so sampling stays lossless.

The context only ever holds the target's true features, read by forward hooks on the target's decoder
layers during its own prefill and verification forwards (no extra target forward, no
``output_hidden_states`` of every layer):

- prefill: every prompt position (image positions included) is a context slot;
- after verification: row i accepted n_i drafts, so the features of ``[cur, d_1..d_{n_i}]`` are true and
  queue as n_i + 1 new slots (right-aligned, the shorter rows left-padded with holes), read together with
  the next block in the next round's one forward. The block itself is never kept (the context cache writes
  it in scratch room), so the base's rollback keeps exactly the context read;
- after a plain target step (``hf_specmm.Auto``): the feature of ``[cur]`` queues after the pending ones.

Written on :class:`~hf_specmm.drafter.Drafter`: ``read_pending`` is the round's one forward (the
root's logits: block position 1), ``read_draft`` reads the block's next position, and a tree's level d is
block position d under every frontier node (:meth:`DFlashDrafter.tree_levels`).

Positions are 1-D sequence positions (``cumsum(mask) - 1`` over the prompt, image tokens included, then one
per token) on every target, M-RoPE ones included: a DFlash drafter has 1-D RoPE. Stock reads
``hidden_states[i + 1]`` for ``i`` in ``target_layer_ids``: layer i's output, the final norm's output for
the last layer (transformers ties the last hidden state to it); the hooks read the same tensors.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ... import _compat
from ...caches import CacheFactory
from ...devices import execution_device
from ...drafter import Drafter, LevelReader, Prompt, Proposal, every_prompt_position
from ...errors import IncompatibleDraftError
from ...hooks import this_call
from ...trees import TreeShape
from ...vocab import VocabMap
from ..feature_head.drafter import keep_every_position
from .context import ContextCache, block_masks
from .modeling import check_target, embed_block, is_dflash_draft


class DFlashDrafter(Drafter):
    """One forward per round proposes the whole block (chain or tree); ``state`` is the context cache
    (:class:`~.context.ContextCache`), ``pending`` the context slots read with the next block (features [A, k, F],
    positions [A, k], valid [A, k]); the block's anchor is the loop's ``cur`` (the target's last token)."""

    observes_prefill = True
    observes_verification = True
    keeps_read_drafts = False  # the block is scratch: only the target's true features stay

    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab)
        config = draft.config
        self.device = execution_device(draft)
        self.block_size, self.mask_token_id = int(config.block_size), int(config.mask_token_id)
        self.max_depth = self.block_size - 1  # the block the drafter was trained on is always read whole
        self.layer_ids = list(config.target_layer_ids)
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
        self.window = getattr(config, "sliding_window", None) if sliding else None
        # speculators' layout's mask flags (extended.py): its window, and causal sliding layers inside the block
        self.from_anchor = bool(getattr(config, "window_from_anchor", False))
        self.causal_sliding = not getattr(config, "sliding_window_non_causal", True)
        self.target: Any = None
        self.captured: torch.Tensor | None = None  # [B, L, len(layer_ids) * H] of the last target forward
        self.prompt_features: torch.Tensor | None = None
        self.verified: torch.Tensor | None = None
        self.block: torch.Tensor | None = None  # [A, block - 1, V] the round's logits of block positions 1..
        self.read = 0  # block positions read this round
        self.anchor_positions: torch.Tensor | None = None  # [A] the position of the next block's anchor (``cur``)

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        if not is_dflash_draft(draft):
            raise IncompatibleDraftError(f"a dflash draft must be a DFlash block drafter, got {type(draft).__name__}")
        check_target(target, draft)

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Every prompt position (image positions included) is a context slot at its own position."""
        return every_prompt_position(input_ids, attention_mask)

    # ---- the target's features -----------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, target: Any) -> Iterator[None]:
        """Capture the outputs of the target's decoder layers ``target_layer_ids`` (the last one: the decoder's
        normed output, as stock's ``hidden_states``; -1: the first layer's input, stock's ``hidden_states[0]``)
        during the forward, concatenated in that order."""
        self.target = target
        decoder = target.get_decoder()
        layers = decoder.layers
        seen: dict[int, torch.Tensor] = {}

        def on_layer(index: int) -> Any:
            def hook(module: Any, args: tuple, output: Any) -> None:
                seen[index] = (output[0] if isinstance(output, tuple) else output).detach()
            return hook

        def on_done(module: Any, args: tuple, output: Any) -> None:
            if len(layers) - 1 in self.layer_ids:
                seen[len(layers) - 1] = output[0].detach()
            first = seen[self.layer_ids[0]]  # a dispatched target's layers may sit on several devices
            self.captured = torch.cat([seen[i].to(first.device) for i in self.layer_ids], -1)
            seen.clear()

        def on_embeds(module: Any, args: tuple, kwargs: dict) -> None:
            seen[-1] = (args[0] if args else kwargs["hidden_states"]).detach()

        handles = [layers[i].register_forward_hook(this_call(on_layer(i))) for i in sorted(set(self.layer_ids))
                   if 0 <= i < len(layers) - 1]
        if -1 in self.layer_ids:
            handles.append(layers[0].register_forward_pre_hook(this_call(on_embeds), with_kwargs=True))
        handles.append(decoder.register_forward_hook(this_call(on_done)))
        # every prompt position's features, also of layers a decoder runs on the last positions only (Gemma 4)
        handles.append(decoder.register_forward_pre_hook(this_call(keep_every_position), with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _take(self) -> torch.Tensor:
        if self.captured is None:
            raise RuntimeError("the target's hidden states at the DFlash drafter's target_layer_ids were not captured")
        captured, self.captured = self.captured, None
        return captured

    def observe_prefill(self, target_outputs: Any) -> None:
        self.prompt_features = self._take()

    def observe_verification(self, target_outputs: Any) -> None:
        self.verified = self._take()

    # ---- the round -----------------------------------------------------------------------------
    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor, new_cache: CacheFactory) -> None:
        """The whole prompt becomes context (read with the first block); the first token is the first anchor.
        The context cache is the drafter's own (:class:`~.context.ContextCache`): its keys are computed from
        target features, not tokens, so the call's cache backend has no say in it."""
        ids, mask = prompt.input_ids, prompt.attention_mask
        features, self.prompt_features = self.prompt_features, None
        mask = torch.ones_like(ids) if mask is None else mask.long()
        self.state = ContextCache(len(self.model.layers), ids.shape[0], self.device)
        self.pending = (features[:, :ids.shape[1]], (mask.cumsum(-1) - 1).clamp_min(0), mask.bool())
        self.anchor_positions = mask.sum(-1)

    def block_logits(self, anchor: torch.Tensor) -> torch.Tensor:
        """One drafter forward: the pending context and the block anchored at ``anchor`` [B] (the loop's ``cur``);
        target-vocabulary logits [B, block - 1, V] of the block's positions 1.. (on the loop's device)."""
        assert self.pending is not None and self.state is not None
        features, positions, valid = self.pending
        batch, device = anchor.shape[0], anchor.device
        ids = torch.full((batch, self.block_size), self.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = anchor
        block_positions = self.anchor_positions[:, None] + torch.arange(self.block_size, device=device)
        self.state.begin(valid, positions)
        dtype = self.model.dtype
        masks = block_masks(self.state.valid, self.state.positions, block_positions.to(self.device), self.window, dtype,
                            self.from_anchor, self.causal_sliding)
        out = self.model(
            noise_embeds=embed_block(self.target, ids).to(self.device, dtype),
            context_hidden_states=features.to(self.device, dtype),
            attention_mask=masks,
            position_ids=torch.cat([positions, block_positions], 1).to(self.device),
            use_cache=True,
            **_compat.cache_kwargs(self.state),
        )
        self.pending = tuple(t[:, :0] for t in self.pending)  # read: the context cache holds them now
        if getattr(self.model, "d2t", None) is not None:  # a reduced draft vocabulary: its own head, mapped by d2t
            logits = self.model.target_logits(out.last_hidden_state[:, 1:])
        else:
            head = self.target.get_output_embeddings()
            logits = head(out.last_hidden_state[:, 1:].to(head.weight.device))
        override = getattr(self.model, "override_block_logits", None)  # the bench's controlled acceptance
        if callable(override):
            logits = override(logits, block_positions[:, :-1])
        return self.vocab.to_target(logits.to(device=device, dtype=torch.float32))

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        """The round's one forward (the pending context and the block at ``cur``); the logits of block position 1."""
        self.block, self.read = self.block_logits(cur), 1
        return self.block[:, 0]

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """The next block position's logits: the block was drafted whole, from the context and the mask tokens
        (a position does not read the draft before it)."""
        self.read += 1
        return self.block[:, self.read - 1]

    def tree_levels(self, shape: TreeShape) -> LevelReader:
        """Level d holds the top-k of block position d + 1 under every frontier node of level d - 1, all from the
        round's one forward (a node's children do not depend on it)."""
        block = self.block
        return lambda tokens, parents, depth: block[:, depth, None].expand(-1, tokens.shape[1], -1)

    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """Queue the true features of ``[cur, d_1..d_{keep_i}]`` (right-aligned; a tree's: of its kept root
        ``path``'s nodes) and move the next block's anchor to the position of ``next_tokens``."""
        assert self.verified is not None and self.anchor_positions is not None
        verified, self.verified, self.block = self.verified.to(keep.device), None, None
        if path is not None:
            verified = verified.gather(1, path[..., None].to(keep.device).expand(-1, -1, verified.shape[-1]))
        width = int(keep.max()) + 1
        source = torch.arange(width, device=keep.device)[None] - (width - 1 - keep[:, None])  # block index per slot
        valid = source >= 0
        source = source.clamp_min(0)
        features = verified.gather(1, source[..., None].expand(-1, -1, verified.shape[-1]))
        self.pending = (features, self.anchor_positions[:, None] + source, valid)
        self.anchor_positions = self.anchor_positions + keep + 1

    def follow(self, next_tokens: torch.Tensor) -> None:
        """A plain step verified ``[cur]`` alone: its true feature queues after the pending ones."""
        assert self.pending is not None and self.verified is not None and self.anchor_positions is not None
        features, positions, valid = self.pending
        feature, self.verified = self.verified[:, :1].to(features.device, features.dtype), None
        self.pending = (torch.cat([features, feature], 1), torch.cat([positions, self.anchor_positions[:, None]], 1),
                        torch.cat([valid, torch.ones_like(valid[:, :1])], 1))
        self.anchor_positions = self.anchor_positions + 1

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.anchor_positions is not None
        super().select_rows(keep)
        self.anchor_positions = self.anchor_positions[keep.to(self.anchor_positions.device)]
