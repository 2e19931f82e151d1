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
  the next block in the next round's one forward. The block itself is never kept: nothing to roll back.

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
from ...budget import RoundBudget
from ...caches import CacheFactory
from ...devices import execution_device
from ...drafter import Drafter, Prompt, Proposal, every_prompt_position
from ...errors import IncompatibleDraftError
from ...selector import Selector
from ..cached import extend_paths
from ...trees import expand_tree
from ...vocab import VocabMap
from .context import ContextCache, block_masks
from .modeling import check_target, embed_block, is_dflash_draft


class DFlashDrafter(Drafter):
    """One forward per round proposes the whole block (chain or tree). Not a
    :class:`~hf_specmm.drafts.cached.CachedDrafter`: its cache holds the target's features (the context), never
    a drafted token, so there is nothing of a round to roll back; it shares the tree-path bookkeeping
    (:func:`~hf_specmm.drafts.cached.extend_paths`) and its ``anchor`` is the tree's root."""

    observes_prefill = True
    observes_verification = True
    selects_rows = True
    drafts_trees = True

    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab)
        config = draft.config
        self.device = execution_device(draft)
        self.block_size, self.mask_token_id = int(config.block_size), int(config.mask_token_id)
        self.layer_ids = list(config.target_layer_ids)
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
        self.window = getattr(config, "sliding_window", None) if sliding else None
        self.target: Any = None
        self.captured: torch.Tensor | None = None  # [B, L, len(layer_ids) * H] of the last target forward
        self.prompt_features: torch.Tensor | None = None
        self.verified: torch.Tensor | None = None
        self.cache: ContextCache | None = None
        # context slots read with the next block: features [B, k, F], valid [B, k], positions [B, k]
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.anchor: torch.Tensor | None = None  # [B] the next block's first token (the target's last)
        self.anchor_positions: torch.Tensor | None = None  # [B]

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
        normed output, as stock's ``hidden_states``) during the forward, concatenated in that order."""
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

        handles = [layers[i].register_forward_hook(on_layer(i)) for i in sorted(set(self.layer_ids))
                   if i < len(layers) - 1]
        handles.append(decoder.register_forward_hook(on_done))
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
        self.cache = ContextCache(len(self.model.layers), ids.shape[0], self.device)
        self.pending = (features[:, :ids.shape[1]], mask.bool(), (mask.cumsum(-1) - 1).clamp_min(0))
        self.anchor, self.anchor_positions = first_tokens, mask.sum(-1)

    def block_logits(self) -> torch.Tensor:
        """One drafter forward: the pending context and the block; target-vocabulary logits [B, block - 1, V] of
        the block's positions 1.. (on the loop's device)."""
        assert self.pending is not None and self.cache is not None and self.anchor is not None
        features, valid, positions = self.pending
        batch, device = self.anchor.shape[0], self.anchor.device
        ids = torch.full((batch, self.block_size), self.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = self.anchor
        block_positions = self.anchor_positions[:, None] + torch.arange(self.block_size, device=device)
        self.cache.begin(valid, positions)
        dtype = self.model.dtype
        masks = block_masks(self.cache.valid, self.cache.positions, block_positions.to(self.device), self.window, dtype)
        out = self.model(
            noise_embeds=embed_block(self.target, ids).to(self.device, dtype),
            context_hidden_states=features.to(self.device, dtype),
            attention_mask=masks,
            position_ids=torch.cat([positions, block_positions], 1).to(self.device),
            use_cache=True,
            **_compat.cache_kwargs(self.cache),
        )
        self.pending = None
        head = self.target.get_output_embeddings()
        logits = head(out.last_hidden_state[:, 1:].to(head.weight.device))
        override = getattr(self.model, "override_block_logits", None)  # the bench's controlled acceptance
        if callable(override):
            logits = override(logits, block_positions[:, :-1])
        return self.vocab.to_target(logits.to(device=device, dtype=torch.float32))

    def propose(self, budget: RoundBudget, select: Selector) -> Proposal:
        """d_1..d_γ from one drafter forward, γ at most ``block_size - 1`` (the block the drafter was trained on
        is always read whole: its positions attend to each other, so a shorter block would draft differently)."""
        if budget.tree is not None:
            return self.propose_tree(budget, select)
        logits = self.block_logits()
        tokens, probs = [], []
        for j in range(min(budget.gamma, self.block_size - 1)):
            token, prob = select(logits[:, j], j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                break
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None)

    def propose_tree(self, budget: RoundBudget, select: Selector) -> Proposal:
        """A block tree from the same one forward: level d holds the top-k of block position d, under every
        frontier node of level d - 1 (the drafter proposes each position from the context and the mask block, so
        a node's children do not depend on it; history-reading processors still see each node's own root path).
        Depth at most ``block_size - 1``."""
        logits = self.block_logits()
        shape = budget.tree.cut(min(budget.tree.depth, self.block_size - 1))
        level_paths: list[torch.Tensor] = []  # the previous level's nodes' root paths [A, K, depth - 1]
        levels = [0]

        def step(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            levels[0] += 1
            level = levels[0]  # the depth of the nodes ``tokens``: their children are block position level + 1
            paths = extend_paths(level_paths, tokens, parents)
            nodes = logits[:, level, None].expand(-1, tokens.shape[1], -1)
            return select.level_scores(nodes, level, paths)

        root = select.level_scores(logits[:, :1], 0)[:, 0]
        tree = expand_tree(self.anchor, root, step, shape)  # rooted at the anchor: the row's current token
        return Proposal(tree.tokens[:, 1:], None, tree=tree, depth=shape.depth)

    def accept(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        """Queue the true features of ``[cur, d_1..d_{keep_i}]`` (right-aligned; a tree's: of its kept root
        ``path``'s nodes) and anchor the next block at ``next_tokens``."""
        n = keep
        assert self.verified is not None and self.anchor_positions is not None
        verified, self.verified = self.verified.to(n.device), None
        if path is not None:
            verified = verified.gather(1, path[..., None].to(n.device).expand(-1, -1, verified.shape[-1]))
        width = int(n.max()) + 1
        source = torch.arange(width, device=n.device)[None] - (width - 1 - n[:, None])  # block index per slot
        valid = source >= 0
        source = source.clamp_min(0)
        features = verified.gather(1, source[..., None].expand(-1, -1, verified.shape[-1]))
        self.pending = (features, valid, self.anchor_positions[:, None] + source)
        self.anchor, self.anchor_positions = next_tokens, self.anchor_positions + n + 1

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.cache is not None and self.pending is not None and self.anchor is not None
        super().select_rows(keep)
        self.cache.select_rows(keep)
        self.pending = tuple(t[keep.to(t.device)] for t in self.pending)
        self.anchor, self.anchor_positions = self.anchor[keep], self.anchor_positions[keep]
