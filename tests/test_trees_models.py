"""Draft trees through real transformers models, every target family: after a real prefill (left-padded batch
of 2, row 0 with an image), ONE target forward over a tree with the 4-D tree mask and per-node positions gives
every node the logits of running its root path as a chain; the accepted path's slots gathered into place
give the next step plain decoding's logits. The same for a text draft LM read level by level (EAGLE-2
expansion with ``LevelAncestry``) and for the feature head's decoder body."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_specmm import _compat, testing
from hf_specmm.targets import target_family, target_spec
from hf_specmm.targets.positions import ROPE_1D
from hf_specmm.trees import DraftTree, LevelAncestry, TreeShape, expand_tree, greedy_verify_tree
from conftest import batch_inputs, target

ATOL = 1e-4
# 7 draft nodes, depths up to 4, two children under the root and under node 1
PARENTS = [-1, 0, 0, 1, 1, 3, 2, 5]
PROMPT = 20  # text prompts of the draft tests: longer than Gemma 3's sliding window (16)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def window(model) -> int | None:
    text = model.config.get_text_config()
    return getattr(text, "sliding_window", None) if _compat.has_sliding_layers(model.config) else None


def forward(model, cache, ids, mask, positions):
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                **_compat.cache_kwargs(cache))
    return out.logits.float()


def chain_logits(model, cache, slot_mask, rule, row: int, tokens: list[int]) -> torch.Tensor:
    """Row ``row`` alone: ``tokens`` fed one after another through a copy of the cache (plain decoding's way)."""
    cache = copy.deepcopy(cache)
    keep = torch.tensor([row])
    _compat.select_cache_rows(cache, keep)
    mask = slot_mask[keep]
    ids = torch.tensor([tokens])
    positions = rule.select(keep).block_positions(mask.sum(-1), None, len(tokens))
    full = torch.cat([mask, mask.new_ones(1, len(tokens))], 1)
    return forward(model, cache, ids, full, positions)[0]


def tree_forward(model, cache, slot_mask, rule, tree: DraftTree, mask_dtype=torch.float32) -> torch.Tensor:
    chain = rule.block_positions(slot_mask.sum(-1), None, tree.max_depth + 1)
    mask = _compat.mask_argument(model.config, lambda w: tree.attention_mask(slot_mask, mask_dtype, w))
    return forward(model, cache, tree.tokens, mask, tree.positions(chain))


def node_paths(tree: DraftTree, row: int) -> list[list[int]]:
    paths: list[list[int]] = [[int(tree.tokens[row, 0])]]
    for i in range(1, tree.tokens.shape[1]):
        paths.append(paths[int(tree.parents[row, i])] + [int(tree.tokens[row, i])])
    return paths


def leaves(tree: DraftTree, row: int) -> list[int]:
    parents = set(tree.parents[row, 1:].tolist())
    return [i for i in range(tree.tokens.shape[1]) if i not in parents]


def assert_nodes_match_chains(model, cache, slot_mask, rule, tree, logits):
    for row in range(tree.batch_size):
        paths = node_paths(tree, row)
        for leaf in leaves(tree, row):  # one chain per leaf checks every node on its path
            expected = chain_logits(model, cache, slot_mask, rule, row, paths[leaf])
            walk = leaf
            while walk >= 0:
                depth = int(tree.depths[row, walk])
                torch.testing.assert_close(logits[row, walk], expected[depth], atol=ATOL, rtol=0,
                                           msg=lambda m: f"row {row} node {walk}: {m}")
                walk = int(tree.parents[row, walk])


def prefill(model, inputs):
    cache = _compat.new_dynamic_cache()
    out = model(**inputs, use_cache=True, **_compat.cache_kwargs(cache))
    mask = inputs["attention_mask"].long()
    rule = target_family(model).positions.bind(model, inputs["input_ids"], mask, dict(inputs))
    return cache, mask, rule, out.logits[:, -1].float()


def text_ids(model, count: int, gen: torch.Generator) -> torch.Tensor:
    spec = target_spec(model)
    allowed = torch.tensor([i for i in range(spec.text_vocab_end) if i not in spec.reserved_ids
                            and i not in set(spec.placeholder_ids)])
    return allowed[torch.randint(0, len(allowed), (count,), generator=gen)]


def greedy_tree(model, cache, slot_mask, rule, cur: torch.Tensor, gen: torch.Generator) -> DraftTree:
    """Row 0 holds the target's greedy continuation along nodes 1-3-5-7 (accepted: n = 4), row 1 along node 2
    only (n = 1); every other node a random text token the target does not choose at its parent."""
    tokens = text_ids(model, 2 * len(PARENTS), gen).view(2, -1)
    tokens[:, 0] = cur
    for row, greedy_nodes in ((0, [1, 3, 5, 7]), (1, [2])):
        paths = {0: [int(cur[row])]}
        for node in range(1, len(PARENTS)):
            parent_path = paths[PARENTS[node]]
            choice = int(chain_logits(model, cache, slot_mask, rule, row, parent_path)[-1].argmax())
            if node in greedy_nodes:
                tokens[row, node] = choice
            while int(tokens[row, node]) == choice and node not in greedy_nodes:
                tokens[row, node] = text_ids(model, 1, gen)[0]
            paths[node] = parent_path + [int(tokens[row, node])]
    return DraftTree.from_parents(tokens, torch.tensor([PARENTS] * 2))


@pytest.mark.parametrize("family", testing.TREE_FAMILIES)
def test_one_tree_forward_equals_chains_and_compaction_equals_plain_decoding(family):
    model = target(family)
    cache, prompt_mask, rule, last = prefill(model, batch_inputs(family, 2))
    slot_mask = prompt_mask
    cur = last.argmax(-1)
    tree = greedy_tree(model, cache, slot_mask, rule, cur, torch.Generator().manual_seed(0))
    work = copy.deepcopy(cache)
    logits = tree_forward(model, work, slot_mask, rule, tree)
    assert_nodes_match_chains(model, cache, slot_mask, rule, tree, logits)
    if window(model) is None:  # sdpa also takes the boolean form
        bool_logits = tree_forward(model, copy.deepcopy(cache), slot_mask, rule, tree, torch.bool)
        torch.testing.assert_close(bool_logits, logits, atol=ATOL, rtol=0)

    acc = greedy_verify_tree(tree, logits)
    assert acc.n.tolist() == [4, 1] and acc.path[0].tolist() == [0, 1, 3, 5, 7]
    start, kept = slot_mask.shape[1], int(acc.n.max()) + 1
    _compat.gather_cache_slots(work, start, acc.path[:, :kept])
    _compat.crop_cache(work, start + kept)
    slot_mask = torch.cat([slot_mask, acc.path_valid[:, :kept].long()], 1)  # row 1: holes after its path
    if window(model) is not None:  # sliding windows count physical slots: holes move left (as the loop does)
        slot_mask, order = torch.sort(slot_mask, dim=1, stable=True)
        _compat.gather_cache_slots(work, 0, order)
    step = forward(model, work, acc.next_tokens[:, None], torch.cat([slot_mask, slot_mask.new_ones(2, 1)], 1),
                   rule.block_positions(slot_mask.sum(-1), None, 1))
    for row in range(2):
        n = int(acc.n[row])
        history = [int(cur[row])] + acc.emitted[row, : n + 1].tolist()
        plain = chain_logits(model, cache, prompt_mask, rule, row, history)[-1]
        torch.testing.assert_close(step[row, -1], plain, atol=ATOL, rtol=0)


def draft_prefill(draft, ids, mask):
    cache = _compat.new_dynamic_cache()
    out = draft(input_ids=ids, attention_mask=mask, position_ids=ROPE_1D.prompt_positions(mask), use_cache=True,
                **_compat.cache_kwargs(cache))
    return cache, out.logits[:, -1].float()


@pytest.mark.parametrize("family", testing.TREE_FAMILIES)
def test_text_draft_reads_the_expansion_level_by_level(family):
    """EAGLE-2 expansion driven by a KV-cached text draft LM: each level is ONE draft forward with the
    ``LevelAncestry`` mask; every fed node's logits equal its root path run as a chain."""
    draft = testing.text_draft_from_target(target(family))
    gen = torch.Generator().manual_seed(1)
    ids = text_ids(target(family), 2 * PROMPT, gen).view(2, PROMPT)  # longer than Gemma 3's window of 16
    mask = torch.ones(2, PROMPT, dtype=torch.long)
    mask[0, :3] = 0
    prefix, root_logits = draft_prefill(draft, ids, mask)
    cache, ancestry, fed = copy.deepcopy(prefix), LevelAncestry(), []
    shape = TreeShape(top_k=3, depth=4, nodes=10)
    start = mask.sum(-1)
    chain = ROPE_1D.block_positions(start, None, shape.depth)

    def step(tokens, parents):
        ancestry.add(parents)
        depth = int(ancestry.depths[0, -1])
        level_mask = _compat.mask_argument(
            draft.config, lambda w: ancestry.attention_mask(mask, torch.float32, w))
        logits = forward(draft, cache, tokens, level_mask, chain[:, depth - 1 : depth].expand(-1, tokens.shape[1]))
        fed.append((tokens, parents, logits))
        return logits

    tree = expand_tree(ids[:, -1], root_logits, step, shape)
    assert len(fed) == shape.depth - 1 and tree.valid.all()
    # every fed node: its path rebuilt from the parents, run as a chain after the prompt
    for row in range(2):
        paths = [[]]
        for tokens, parents, logits in fed:
            paths = [paths[max(int(p), 0)] + [int(t)] for t, p in zip(tokens[row], parents[row])]
            for k, path in enumerate(paths):
                expected = chain_logits(draft, prefix, mask, ROPE_1D, row, path)[-1]
                torch.testing.assert_close(logits[row, k], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3", "internvl"])
def test_feature_head_body_takes_the_tree_mask(family):
    """The feature head (our module; its body is the family's text decoder) with a 4-D tree mask: every node's
    predicted feature equals its root path's chain run."""
    model = target(family)
    head = testing.feature_head_from_target(model, noise=0.3)
    gen = torch.Generator().manual_seed(2)
    hidden = head.config.text_config.hidden_size
    ids = text_ids(model, 2 * PROMPT, gen).view(2, PROMPT)
    mask = torch.ones(2, PROMPT, dtype=torch.long)
    mask[0, :2] = 0
    rule = target_family(model).positions.bind(model, ids, mask, {})

    def run(cache, features, tokens, attention_mask, positions):
        return head(features=features, input_ids=tokens, attention_mask=attention_mask, position_ids=positions,
                    cache=cache, use_cache=True).hidden_states

    prefix = _compat.new_dynamic_cache()
    run(prefix, torch.randn(2, PROMPT, hidden, generator=gen), ids, mask, rule.prompt_positions(mask))
    tree = DraftTree.from_parents(text_ids(model, 16, gen).view(2, 8), torch.tensor([PARENTS] * 2))
    features = torch.randn(2, 8, hidden, generator=gen)  # each node's input feature (its parent's prediction)
    chain = rule.block_positions(mask.sum(-1), None, tree.max_depth + 1)
    tree_mask = _compat.mask_argument(head.config.text_config,
                                                lambda w: tree.attention_mask(mask, torch.float32, w))
    out = run(copy.deepcopy(prefix), features, tree.tokens, tree_mask, tree.positions(chain))
    for row in range(2):
        for leaf in leaves(tree, row):
            path, walk = [], leaf
            while walk >= 0:
                path.append(walk)
                walk = int(tree.parents[row, walk])
            path = path[::-1]
            cache = copy.deepcopy(prefix)
            keep = torch.tensor([row])
            _compat.select_cache_rows(cache, keep)
            m = torch.cat([mask[keep], mask.new_ones(1, len(path))], 1)
            positions = rule.select(keep).block_positions(mask[keep].sum(-1), None, len(path))
            expected = run(cache, features[row, path][None], tree.tokens[row, path][None], m, positions)[0]
            torch.testing.assert_close(out[row, path], expected, atol=ATOL, rtol=0)
