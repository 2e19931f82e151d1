"""Draft trees as tensors: layout, masks, EAGLE-2 expansion against a brute-force reference, greedy and
sampling verification (χ² against the target distribution with a fixed generator)."""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_specmm.trees import (DraftTree, LevelAncestry, TreeShape, expand_tree, greedy_verify_tree,
                             sample_verify_tree, top_k_first_index, tree_attention_mask)
from hf_specmm.verifier import greedy_verify

VOCAB = 11


def path_logits(path: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """A draft whose next-token logits depend on the whole root path (seeded by it), with a few -inf tokens."""
    gen = torch.Generator().manual_seed(hash((salt,) + path) % (2 ** 31))
    logits = 2.0 * torch.randn(VOCAB, generator=gen)
    logits[VOCAB - 1] = float("-inf")  # a token the draft may never propose
    return logits


class PathDraft:
    """``step`` of a path-dependent draft: rebuilds every fed node's path from the ``parents`` it is given, so
    a wrong ``parents`` changes the logits (and fails the comparison with the reference)."""

    def __init__(self, roots: list[int], salt: int = 0):
        self.paths = [[(r,)] for r in roots]  # per row: the previous call's K paths ([root] before the first)
        self.salt = salt
        self.fed: list[list[tuple[int, ...]]] = [[] for _ in roots]  # per row: every fed slot's path

    def root_logits(self) -> torch.Tensor:
        return torch.stack([path_logits(p[0], self.salt) for p in self.paths])

    def __call__(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        out = []
        for b in range(tokens.shape[0]):
            prev = self.paths[b]
            paths = [prev[0 if int(q) < 0 else int(q)] + (int(t),) for t, q in zip(tokens[b], parents[b])]
            self.paths[b] = paths
            self.fed[b].extend(paths)
            out.append(torch.stack([path_logits(p, self.salt) for p in paths]))
        return torch.stack(out)


def reference_expansion(root: int, shape: TreeShape, salt: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """EAGLE-2 in plain Python: (path, cumulative score) of the kept nodes, ties to the earlier candidate."""
    def top(path):
        logp = torch.log_softmax(path_logits(path, salt), -1).clamp_max(0).tolist()
        return sorted(range(VOCAB), key=lambda t: (-logp[t], t))[: shape.top_k], logp

    candidates = []  # (score, creation index, path)
    tokens, logp = top((root,))
    frontier = [((root, t), logp[t]) for t in tokens]
    candidates += [(s, len(candidates) + i, p) for i, (p, s) in enumerate(frontier)]
    for _ in range(shape.depth - 1):
        level = []
        for path, score in frontier:
            tokens, logp = top(path)
            level += [(path + (t,), score + logp[t]) for t in tokens]
        base = len(candidates)
        candidates += [(s, base + i, p) for i, (p, s) in enumerate(level)]
        frontier = [level[i] for i in sorted(range(len(level)), key=lambda i: (-level[i][1], i))[: shape.top_k]]
    kept = sorted(candidates, key=lambda c: (-c[0], c[1]))[: shape.nodes]
    return [(p, s) for s, _, p in sorted(kept, key=lambda c: c[1])]


def node_paths(tree: DraftTree, b: int) -> list[tuple[int, ...]]:
    paths = [(int(tree.tokens[b, 0]),)]
    for i in range(1, tree.tokens.shape[1]):
        paths.append(paths[int(tree.parents[b, i])] + (int(tree.tokens[b, i]),))
    return paths


def test_layout_depths_ancestors_and_errors():
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]])
    tree = DraftTree.from_parents(torch.arange(12).view(2, 6), parents, valid=torch.tensor([[1, 1, 0, 1, 1, 1]] * 2))
    assert tree.depths.tolist() == [[0, 1, 1, 2, 3, 2], [0, 1, 2, 3, 4, 5]]
    for b, i, j in itertools.product(range(2), range(6), range(6)):
        walk, seen = i, set()
        while walk >= 0:
            seen.add(walk)
            walk = int(parents[b, walk])
        assert bool(tree.ancestors[b, i, j]) == (j in seen)
    assert tree.valid.tolist() == [[True, True, False, True, True, False], [True, True, False, False, False, False]]
    assert tree.path_to(torch.tensor([4, 3])).tolist() == [[0, 1, 3, 4, 4, 4], [0, 1, 2, 3, 3, 3]]
    assert tree.limit_depth(torch.tensor([1, 5])).valid[0].tolist() == [True, True, False, False, False, False]
    with pytest.raises(ValueError, match="parent must be an earlier node"):
        DraftTree.from_parents(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[-1, 2, 0]]))
    with pytest.raises(ValueError, match="node 0 must be the root"):
        DraftTree.from_parents(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="exceeds the 6 candidates"):
        TreeShape(top_k=2, depth=2, nodes=7)
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        TreeShape(top_k=0, depth=2, nodes=1)


def test_attention_mask_prefix_holes_window_and_dtypes():
    tree = DraftTree.from_parents(torch.zeros(2, 4, dtype=torch.long), torch.tensor([[-1, 0, 1, 0]] * 2),
                                  valid=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))
    prefix = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 0, 1, 1]])  # left padding, a hole
    allowed = tree.attention_mask(prefix, torch.bool)
    assert allowed.shape == (2, 1, 4, 9)
    assert allowed[0, 0, 2].int().tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 0]
    assert allowed[1, 0, 3].int().tolist() == [1, 1, 0, 1, 1, 1, 0, 0, 1]  # invalid: seen by no valid node
    assert allowed[1, 0, 1].int().tolist() == [1, 1, 0, 1, 1, 1, 1, 0, 0]
    additive = tree.attention_mask(prefix, torch.float16)
    assert additive.dtype == torch.float16 and torch.equal(additive == 0, allowed)
    assert bool((additive[~allowed] == torch.finfo(torch.float16).min).all())
    # window 3: the depth-2 node sits at chain slot 5 + 2 = 7, sees slots 5..7 (root, parent, itself)
    windowed = tree.attention_mask(5, torch.bool, sliding_window=3)
    assert windowed[0, 0, 2].int().tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert windowed[0, 0, 0].int().tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    same = tree_attention_mask(5, tree.ancestors, tree.depths, tree.depths, torch.bool, 3)
    assert torch.equal(same, windowed)


def test_top_k_breaks_ties_toward_the_lower_index():
    values = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 3.0], [float("-inf")] * 4 + [2.0, float("-inf")]])
    got, index = top_k_first_index(values, 3)
    assert index.tolist() == [[1, 2, 4], [4, 0, 1]]
    assert got[0].tolist() == [3.0] * 3
    assert top_k_first_index(values, 1)[1][:, 0].tolist() == values.argmax(-1).tolist()


@pytest.mark.parametrize("shape", [TreeShape(2, 3, 6), TreeShape(3, 4, 14), TreeShape(4, 2, 20), TreeShape(3, 1, 2)])
def test_expansion_matches_brute_force_eagle2(shape):
    roots = [3, 5, 3]
    draft = PathDraft(roots, salt=shape.top_k)
    tree = expand_tree(torch.tensor(roots), draft.root_logits(), draft, shape)
    assert tree.tokens.shape == (3, shape.nodes + 1)
    for b, root in enumerate(roots):
        expected = reference_expansion(root, shape, salt=shape.top_k)
        paths = node_paths(tree, b)
        assert paths[1:] == [p for p, _ in expected], b
        assert tree.scores[b, 1:].tolist() == pytest.approx([s for _, s in expected], abs=1e-5)
        assert bool(tree.valid[b].all()) == all(s > float("-inf") for _, s in expected)
        for i in range(1, shape.nodes + 1):  # draft_slots: the fed slot that read the node
            slot = int(tree.draft_slots[b, i])
            assert slot < 0 or draft.fed[b][slot] == paths[i]
            assert slot >= 0 or paths[i] not in draft.fed[b]


def test_top1_expansion_is_the_greedy_chain():
    gamma, roots = 5, [2, 7]
    draft = PathDraft(roots)
    tree = expand_tree(torch.tensor(roots), draft.root_logits(), draft, TreeShape(1, gamma, gamma))
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3, 4]] * 2
    for b, root in enumerate(roots):
        path = (root,)
        for _ in range(gamma):
            path += (int(path_logits(path).argmax()),)
        assert tree.tokens[b].tolist() == list(path)
    assert tree.draft_slots.tolist() == [[-1, 0, 1, 2, 3, -1]] * 2


def test_level_ancestry_follows_parents():
    ancestry = LevelAncestry()
    ancestry.add(torch.tensor([[-1, -1, -1]]))
    ancestry.add(torch.tensor([[2, 0, 2]]))
    seen = ancestry.add(torch.tensor([[1, 1, 0]]))
    # level 3's slot 0: parent = level 2's slot 1 (fed slot 4), whose parent is level 1's slot 0
    expected = [[1, 0, 0, 0, 1, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0, 0, 1, 0], [0, 0, 1, 1, 0, 0, 0, 0, 1]]
    assert seen[0].int().tolist() == expected
    assert ancestry.depths.tolist() == [[1, 1, 1, 2, 2, 2, 3, 3, 3]]
    mask = ancestry.attention_mask(4, torch.bool, sliding_window=2)  # level 3 at chain slot 4 + 2 = 6
    # the window drops the level-1 ancestor (chain slot 4, two before the query's 6) and the whole prefix
    assert mask[0, 0, 0].int().tolist() == [0, 0, 0, 0] + [0, 0, 0, 0, 1, 0, 1, 0, 0]
    assert ancestry.attention_mask(torch.tensor([[1, 0, 1, 1]]), torch.bool)[0, 0, 2].int().tolist() == \
        [1, 0, 1, 1] + expected[2]


def brute_force_greedy(tree: DraftTree, argmax: torch.Tensor, b: int) -> tuple[list[int], int]:
    """The longest root path of matching valid nodes (lowest index among equals), by walking every node."""
    best = [0]
    for i in range(1, tree.tokens.shape[1]):
        path, walk = [], i
        while walk > 0:
            path.append(walk)
            walk = int(tree.parents[b, walk])
        path = [0] + path[::-1]
        ok = all(bool(tree.valid[b, j]) and int(tree.tokens[b, j]) == int(argmax[b, tree.parents[b, j]]) for j in path[1:])
        if ok and len(path) > len(best):
            best = path
    return best, int(argmax[b, best[-1]])


def test_greedy_verification_against_brute_force_and_chain():
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        batch, width, vocab = 4, 9, 3  # a small vocabulary: many matches, deep paths
        parents = torch.stack([torch.cat([torch.tensor([-1]), torch.cat([torch.randint(0, i, (1,), generator=gen)
                                                                          for i in range(1, width)])]) for _ in range(batch)])
        tokens = torch.randint(0, vocab, (batch, width), generator=gen)
        valid = torch.rand(batch, width, generator=gen) > 0.15
        tree = DraftTree.from_parents(tokens, parents, valid=valid)
        scores = torch.randn(batch, width, vocab, generator=gen)
        acc = greedy_verify_tree(tree, scores)
        argmax = scores.argmax(-1)
        for b in range(batch):
            path, nxt = brute_force_greedy(tree, argmax, b)
            n = len(path) - 1
            assert int(acc.n[b]) == n and acc.path[b, : n + 1].tolist() == path, (trial, b)
            assert acc.emitted[b, : n + 1].tolist() == tokens[b, path[1:]].tolist() + [nxt]
            assert int(acc.next_tokens[b]) == nxt and acc.path_valid[b].sum() == n + 1
    # a chain tree (K = 1) is verified exactly as the chain verifier does
    drafts = torch.tensor([[4, 1, 2, 0], [3, 3, 3, 3]])
    scores = torch.nn.functional.one_hot(torch.tensor([[4, 1, 0, 0, 2], [3, 3, 3, 3, 1]]), 5).float()
    chain = DraftTree.from_parents(torch.cat([torch.zeros(2, 1, dtype=torch.long), drafts], 1),
                                   torch.tensor([[-1, 0, 1, 2, 3]] * 2))
    acc = greedy_verify_tree(chain, scores)
    n, emitted = greedy_verify(drafts, scores)
    assert torch.equal(acc.n, n)
    for b in range(2):  # the new tokens (entries past n are unspecified in both layouts)
        assert acc.emitted[b, : n[b] + 1].tolist() == emitted[b, : n[b] + 1].tolist()


# ---- sampling -------------------------------------------------------------------------------------------
V = 5
# a tree whose children repeat tokens across parents and reach depth 3; node order = sibling try order
TREE_TOKENS = [0, 2, 0, 4, 1, 2, 3, 2, 0]
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 4]


def conditional(context: tuple[int, ...]) -> torch.Tensor:
    """The synthetic target: p(. | tokens after the root), a fixed random distribution per context."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 10 ** 6)
    return torch.softmax(1.5 * torch.randn(V, generator=gen), -1)


def tree_probs(tree: DraftTree) -> torch.Tensor:
    paths = node_paths(tree, 0)
    return torch.stack([conditional(p[1:]) for p in paths])


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of target probability 0 was emitted"
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat.double() / 2))


def sampled_pairs(tree: DraftTree, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` copies of one tree in one batch; returns the first two emitted tokens of each (a second
    token beyond the round comes from the target given the first, as the next round's first would)."""
    gen = torch.Generator().manual_seed(seed)
    big = DraftTree.from_parents(tree.tokens.expand(samples, -1), tree.parents.expand(samples, -1),
                                 valid=tree.valid.expand(samples, -1))
    acc = sample_verify_tree(big, tree_probs(tree)[None].expand(samples, -1, -1), gen)
    first = acc.emitted[:, 0]
    second = acc.emitted[:, 1]
    short = acc.n == 0
    fallback = torch.stack([torch.multinomial(conditional((int(t),)), 1, generator=gen)[0] for t in first[short]]) \
        if bool(short.any()) else first[:0]
    second = second.masked_scatter(short, fallback)
    return first, second, acc.n


@pytest.mark.parametrize("valid_mask", [None, [1, 1, 0, 1, 1, 1, 1, 1, 1]])
def test_sampling_first_two_tokens_follow_the_target(valid_mask):
    valid = None if valid_mask is None else torch.tensor([valid_mask], dtype=torch.bool)
    tree = DraftTree.from_parents(torch.tensor([TREE_TOKENS]), torch.tensor([TREE_PARENTS]), valid=valid)
    samples = 60000
    first, second, n = sampled_pairs(tree, samples, seed=1)
    assert int(n.max()) == 3 and bool((n == 0).any())  # every kind of round happened
    p1 = conditional(())
    assert chi2_pvalue(torch.bincount(first, minlength=V).double(), p1.double()) > 1e-3
    joint = torch.stack([p1[a] * conditional((a,)) for a in range(V)]).flatten()
    counts = torch.bincount(first * V + second, minlength=V * V).double()
    assert chi2_pvalue(counts, joint.double()) > 1e-3
    # the test has the power to see a small bias: the same counts against a slightly different target fail
    biased = torch.stack([p1[a] * conditional((a,)) for a in range(V)])
    biased[:, 0] *= 1.15
    assert chi2_pvalue(counts, (biased / biased.sum()).flatten().double()) < 1e-6
    accepted_first = set(first[n >= 1].tolist())
    if valid is None:
        assert accepted_first == {2, 0, 4}
    else:  # the invalid node (token 0 under the root) is never accepted, nor its subtree
        assert accepted_first == {2, 4}


def test_sampling_accepts_a_point_mass_target_path_entirely():
    tree = DraftTree.from_parents(torch.tensor([TREE_TOKENS]), torch.tensor([TREE_PARENTS]))
    target = torch.zeros(9, V)
    # root -> node 1 (token 2) -> node 4 (token 1) -> node 8 (token 0), then the bonus token 3
    for node, token in enumerate([2, 1, 0, 0, 0, 0, 0, 0, 3]):
        target[node, token] = 1.0
    for seed in range(5):
        acc = sample_verify_tree(tree, target[None], torch.Generator().manual_seed(seed))
        assert acc.n.tolist() == [3] and acc.path[0].tolist() == [0, 1, 4, 8] and acc.emitted[0].tolist() == [2, 1, 0, 3]
