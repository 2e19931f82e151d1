"""Draft trees (EAGLE-2 dynamic trees): trees as tensors, no loop knowledge.

Data layout (static shapes: every row of a batch has N + 1 nodes every round, like vLLM's
``propose_tree`` and SGLang's EAGLE worker)::

    DraftTree                        B rows, node 0 = root = the row's last accepted token (``cur``)
      tokens       [B, N+1] long     target ids
      parents      [B, N+1] long     -1 at the root; parents[b, i] < i (parents before children)
      depths       [B, N+1] long     root 0
      ancestors    [B, N+1, N+1]     bool, node i sees node j iff j is i or an ancestor of i
      valid        [B, N+1] bool     nodes a row may not use (draft probability 0, past its token budget:
                                     ``limit_depth``) stay in place, never accepted, never attended to
      scores       [B, N+1] float    cumulative draft log-probability (ranking only)
      draft_slots  [B, N+1] long     where the draft read the node during the expansion (-1: never)

Contracts the loop uses, one round per call (P = the target cache's slots before the round)::

    tree = expand_tree(cur, root_logits, step, TreeShape(top_k=K, depth=D, nodes=N))
        # root_logits [B, V]: the draft's logits after reading cur; step(tokens [B, K], parents [B, K])
        # -> logits [B, K, V] reads one level (D - 1 calls); a KV-cached draft builds each call's mask with
        # LevelAncestry.add(parents) / .attention_mask(draft_prefix_mask, dtype, window) and its positions
        # from its position rule's chain positions at column (depth - 1).
        # K=1, D=N=γ: exactly the greedy chain.
    tree = tree.limit_depth(budget - 1)                       # rows near max_length
    chain = positions.block_positions(next_start, None, D + 1)  # [B, D+1] or M-RoPE [4, B, D+1]
    mask = tree.attention_mask(slot_mask_or_P, dtype=target.dtype, sliding_window=window)  # [B,1,N+1,P+N+1]
    out = target(input_ids=tree.tokens, position_ids=tree.positions(chain),
                 attention_mask=_compat.mask_argument(target.config, make_mask), cache=...)
        # _compat.mask_argument: one tensor, or Gemma 3's {layer type: mask} (window on sliding
        # layers only); make_mask(window) is the line above
    acc = greedy_verify_tree(tree, scores)      # scores [B, N+1, V] processed target scores at the nodes
    acc = sample_verify_tree(tree, probs, gen)  # probs  [B, N+1, V]; lossless, needs no draft probabilities
        # acc.n [B] accepted nodes, acc.emitted [B, D+1] (first n+1 = new tokens, as verifier.greedy_verify's),
        # acc.next_tokens [B] (the next cur), acc.path [B, D+1] / acc.path_valid: the kept root path
    _compat.gather_cache_slots(cache, P, acc.path[:, :m + 1]); crop to P + m + 1; slot mask
        cat(slot_mask, acc.path_valid[:, :m + 1]) where m = max kept; sliding-window caches then move holes
        left as today (SlottedCache.rollback(compact=True))
    draft: keep the slots tree.draft_slots[path] of the accepted nodes it read, then queue as a chain does

Processors: the loop applies its logits processors to the target's scores (``TreeBlock.scores``) and the
drafter to the draft's (``DraftSelector.level_scores``) at every node; a processor that reads the token history
sees the row's history plus the node's root path (``DraftTree.root_paths``), never another branch's tokens.

In ``generate``: ``assistant_model=hf_specmm.Tree(draft, top_k=K, depth=D, nodes=N)`` (:class:`Tree`). The
drafters draft through :meth:`~hf_specmm.drafter.Drafter.propose_tree` (one forward per level on their own
cache), the loop verifies a :class:`~hf_specmm.block.TreeBlock` (one target forward) with the tree rules
above, and both caches keep the accepted path in place (``SlottedCache.rollback`` with a path).
"""

from .expand import StepFn, TreeShape, expand_tree, extend_paths, top_k_first_index
from .tree import DraftTree, LevelAncestry, tree_attention_mask
from .verify import Acceptance, greedy_verify_tree, sample_verify_tree

__all__ = ["Acceptance", "DraftTree", "LevelAncestry", "StepFn", "TreeShape", "expand_tree", "extend_paths",
           "greedy_verify_tree", "sample_verify_tree", "top_k_first_index", "tree_attention_mask"]
