"""``hf_specmm.Auto``: each round's shape chosen from measured costs and learned acceptance.

Rounds that switch between plain steps, chains and trees within one call keep every draft kind's caches and
pending tokens right (greedy output equal to plain generate, exact copies accepted along every drafted
round's whole depth); sampling keeps the target's distribution (χ²); the acceptance table, the expected
lengths, the cost interpolation and the policy's choice are checked on numbers worked by hand; options with
no meaning are refused before any forward.
"""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.auto import COSTS, AcceptanceTable, CostAwarePolicy, CostTable, chain_lengths, tree_lengths
from hf_specmm.auto.acceptance import tree_observations
from hf_specmm.auto.costs import interpolate
from hf_specmm.auto.policy import PLAIN, Shape
from hf_specmm.trees import DraftTree, TreeShape
from conftest import batch_inputs, draft, target
from eagle3_fixtures import lagged_head
from test_sampling import ALPHA, chi2_homogeneity_pvalue, noisy_copy
from test_trees_generate import exact_drafts, generate, sharp_target

NEW = 16
#: plain steps, chains and trees in turn, so every switch happens: plain→chain→tree→plain→plain→tree→tree→chain
#: →chain→plain→chain
ALTERNATING = (0, 3, TreeShape(2, 3, 5), 0, 0, TreeShape(3, 4, 10), TreeShape(2, 2, 3), 1, 2, 0, 4)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def assert_drafted_rounds_accept_everything(stats, name: str) -> None:
    """Every row kept γ + 1 tokens in each drafted round (plain rounds: 1), but its last (EOS may cut it)."""
    checked = 0
    for row in zip(*stats.tokens_per_round):
        live = [(kept, gamma) for kept, gamma in zip(row, stats.gammas) if kept > 0]
        for kept, gamma in live[:-1]:
            assert kept == gamma + 1, (name, stats.auto["shapes"], stats.tokens_per_round)
            checked += gamma > 0
    assert checked > 0, name


@pytest.mark.parametrize("family", ("llava", "qwen2_5_vl"))
@pytest.mark.parametrize("batch", (1, 3))
def test_alternating_shapes_every_draft_kind_equal_plain_and_copies_accept_everything(family, batch):
    model = sharp_target(family)
    inputs = batch_inputs(family, batch)
    text_inputs = batch_inputs(family, batch, with_images=False)
    new = 24  # exact copies keep whole rounds: the 8 shapes below fit before max_new_tokens cuts one
    plain = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    plain_text = model.generate(**text_inputs, max_new_tokens=new, do_sample=False)
    for name, d in exact_drafts(family, model).items():
        auto = hf_specmm.Auto(d, shapes=ALTERNATING)
        out, stats = generate(model, inputs, max_new_tokens=new, assistant_model=auto)
        assert torch.equal(out, plain), f"{family} {name}:\n{out}\n!=\n{plain}"
        assert stats.auto["shapes"][:8] == ["plain", "chain 3", "tree 2,3,5", "plain", "plain", "tree 3,4,10",
                                            "tree 2,2,3", "chain 1"]
        if name in ("vlm", "feature_head"):  # they read the images: exact on image prompts too
            assert_drafted_rounds_accept_everything(stats, f"{family} {name}")
        out, stats = generate(model, text_inputs, max_new_tokens=new, assistant_model=auto)
        assert torch.equal(out, plain_text), f"{family} {name} text:\n{out}\n!=\n{plain_text}"
        assert_drafted_rounds_accept_everything(stats, f"{family} {name} text")
    vocab = model.get_input_embeddings().weight.shape[0]
    for head in (lagged_head(model), lagged_head(model, vocab // 2)):  # EAGLE-3: partial acceptance
        out, stats = generate(model, inputs, max_new_tokens=new, assistant_model=hf_specmm.Auto(head, shapes=ALTERNATING))
        assert torch.equal(out, plain), f"{family} eagle3:\n{out}\n!=\n{plain}"
        assert stats.drafted_tokens > 0


@pytest.mark.parametrize("family", ("llava", "gemma3"))
def test_cost_aware_auto_equals_plain_and_learns_which_draft_is_useful(family):
    """Four calls each with a useful and a useless draft: outputs equal plain's; the first call calibrates
    (its first rounds time the calibration shapes) and the learned acceptance tells the two drafts apart."""
    model = target(family)
    inputs = batch_inputs(family, 3, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    COSTS.clear()
    first_choice = {}
    for kind in ("self", "random"):
        auto = hf_specmm.Auto(draft(family, kind), max_tokens=8, max_depth=4)  # 5 calibration shapes
        predicted = []
        for call in range(4):
            out, stats = generate(model, inputs, max_new_tokens=24, assistant_model=auto)
            assert torch.equal(out, plain), f"{family} {kind} call {call}"
            report = stats.auto
            if report["shapes"] == ["plain generate"]:  # the call ran as plain generate (costs calibrated)
                predicted.append(True)
                continue
            assert len(report["shapes"]) == len(stats.gammas) and report["cost_key"]
            assert sum(s["rounds"] for s in report["per_shape"].values()) == len(stats.gammas)
            if call == 0:
                assert report["calibration_rounds"] > 0 and "plain" in report["shapes"]
            predicted.append(report["predicted_tokens_per_s"] is not None and report["measured_tokens_per_s"] > 0)
        first_choice[kind] = auto.acceptance(model).probabilities(1, 1)[0][0]
        # the pair's acceptance is the process's: another Auto around the same draft starts from it
        assert hf_specmm.Auto(draft(family, kind)).acceptance(model) is auto.acceptance(model)
        # which shape pays is timing (benchmarks), not unit-test matter: the choice is tested on given costs below
        assert any(predicted), kind
    assert first_choice["self"] > 0.9 > 0.2 > first_choice["random"], first_choice


def test_auto_sampling_matches_plain_sampling():
    """χ² homogeneity per position between plain sampling and Auto's alternating plain / chain / tree rounds."""
    family, rows, new = "llava", 600, 6
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["what color is the circle ?"] * rows,
                                 [testing.tiny_image(0)] * rows)
    sampling = dict(do_sample=True, temperature=0.9, top_k=40, max_new_tokens=new)
    torch.manual_seed(1)
    plain = model.generate(**inputs, **sampling)[:, -new:]
    auto = hf_specmm.Auto(noisy_copy(model), shapes=(TreeShape(3, 2, 5), 0, 1))
    hf_specmm.enable(model)
    try:
        torch.manual_seed(2)
        ours = model.generate(**inputs, **sampling, assistant_model=auto)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert stats.accepted_tokens > 0 and {"tree 3,2,5", "plain", "chain 1"} <= set(stats.auto["shapes"])
    vocab = model.config.get_text_config().vocab_size
    for position in range(new):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, position], ours[:, -new + position], vocab)
        assert p > ALPHA, f"position {position}: χ²={stat:.1f} dof={dof} p={p:.2e}"
    assert auto.acceptance(model, sampling=True).trials[0][0] > 0 and auto.acceptance(model).trials[0][0] == 0


def test_acceptance_table_counts_hazards_by_depth_and_rank():
    table = AcceptanceTable(depth=4, ranks=3)
    for _ in range(200):
        table.observe_chain([2], [3])  # depth 1, 2 accepted, depth 3 rejected
    p = table.probabilities(4, 3)
    assert p[0][0] > 0.97 and p[1][0] > 0.97 and p[2][0] < 0.05
    # a tree: the root's 3 children tried, rank 1 accepted; that node's 2 children both rejected
    tree = AcceptanceTable(depth=4, ranks=3)
    for _ in range(300):
        tree.observe_tree([1], [[3, 2]], [[1, 0]])
    h = [tree.hazard(1, r) for r in range(3)]
    assert h[0] < 0.05 and h[1] > 0.95 and tree.hazard(2, 0) < 0.05 and tree.hazard(2, 1) < 0.05
    assert tree.trials[0][2] == 0  # rank 2 was never tried: the search stopped at rank 1


def test_tree_observations_read_children_and_ranks_along_the_path():
    # root 0 -> children 1, 2 (ranks 0, 1); node 2 -> children 3, 4; node 4 invalid
    tree = DraftTree.from_parents(torch.tensor([[9, 1, 2, 3, 4]]), torch.tensor([[-1, 0, 0, 2, 2]]),
                                  valid=torch.tensor([[True, True, True, True, False]]))
    counts, ranks = tree_observations(tree, torch.tensor([2]), torch.tensor([[0, 2, 3]]))
    assert counts == [[2, 1, 0]] and ranks[0][:2] == [1, 0]


def test_expected_lengths_of_chains_and_trees():
    p = [[0.5, 0.3], [0.5, 0.3]]
    assert chain_lengths(p, 2) == pytest.approx([0.5, 0.75])
    # K=1 trees are chains; K=2 depth 2 with all 2 + 4 nodes: 0.5 + 0.3 + (0.5 + 0.3)·(0.5 + 0.3)
    assert tree_lengths(p, 1, 2, [2])[(2, 2)] == pytest.approx(0.75)
    values = tree_lengths(p, 2, 2, [3, 6])
    assert values[(2, 6)] == pytest.approx(0.8 + 0.8 * 0.8) and values[(2, 3)] == pytest.approx(0.5 + 0.3 + 0.25)


def test_cost_interpolation_and_the_policy_choice():
    assert interpolate({1: 1.0, 9: 2.0}, 5) == pytest.approx(1.5)
    assert interpolate({1: 1.0, 9: 2.0}, 17) == pytest.approx(3.0)
    assert interpolate({4: 1.0}, 16) == 1.0

    def costs(verify_slope: float, step: float) -> CostTable:
        table = CostTable()
        for kind in ("chain", "tree"):
            for w in (1, 2, 3, 5, 9, 17, 33, 65):
                table.add(kind, w, None, 0.0, 1.0 + verify_slope * (w - 1))
        for g in (1, 2, 4, 8):
            table.add("chain", g + 1, f"chain:{g}", step * g, 1.0 + verify_slope * g)
        for k, d in ((2, 4), (4, 4), (4, 6), (8, 6)):
            table.add("tree", 1, f"tree:{k},{d}", step * d, 1.0)
        return table

    policy = CostAwarePolicy(max_tokens=64, max_depth=8)
    good, useless, ranked = AcceptanceTable(), AcceptanceTable(), AcceptanceTable()
    for _ in range(400):
        good.observe_chain([8], [8])
        useless.observe_chain([0], [8])
        ranked.observe_tree([3], [[4, 4, 4, 4]], [[1, 1, 1]])  # the target's token is the draft's 2nd choice
    # a cheap draft, a flat verification (a GPU): the full depth (a tree's extra nodes are free there); a
    # verification that grows with width (a CPU): the chain; a useless draft: plain steps
    assert policy.rank(good, costs(0.0, 0.02), 1)[0].shape.gamma == 8
    assert policy.rank(good, costs(0.05, 0.02), 1)[0].shape == Shape(8)
    assert policy.rank(useless, costs(0.0, 0.02), 1)[0].shape == PLAIN
    # a draft as costly as the target: plain steps even when it is always right
    assert policy.rank(good, costs(0.0, 1.0), 1)[0].shape == PLAIN
    # the 2nd choice right: only trees gain, and only where wide verification is cheap
    assert policy.rank(ranked, costs(0.0, 0.02), 1)[0].shape.tree is not None
    assert policy.rank(ranked, costs(1.0, 0.02), 1)[0].shape == PLAIN


def test_costs_file_round_trip(tmp_path):
    model = target("llava")
    inputs = batch_inputs("llava", 1, with_images=False)
    path = tmp_path / "costs.json"
    COSTS.clear()
    auto = hf_specmm.Auto(draft("llava", "self"), max_tokens=8, max_depth=3, costs_file=path)
    for _ in range(8):  # the calibration ends within these calls; the file is written then
        _, stats = generate(model, inputs, max_new_tokens=16, assistant_model=auto)
        if path.exists():
            break
    saved = json.loads(path.read_text())
    (key, table), = saved.items()
    assert "batch<=1" in key and table["verify"]["chain"]["1"] and table["draft"]["chain:2"]
    COSTS.clear()
    again = hf_specmm.Auto(draft("llava", "self"), max_tokens=8, max_depth=3, costs_file=path)
    _, stats = generate(model, inputs, max_new_tokens=16, assistant_model=again)
    assert stats.auto["calibration_rounds"] == 0  # the loaded costs need no calibration
    path.write_text("{not json")
    COSTS.clear()
    with pytest.raises(ValueError, match="not valid JSON"):
        generate(model, inputs, max_new_tokens=4, assistant_model=hf_specmm.Auto(draft("llava", "self"), costs_file=path))


def test_options_with_no_auto_meaning_are_refused_before_any_forward():
    model = target("llava")
    inputs = batch_inputs("llava", 2)
    auto = hf_specmm.Auto(draft("llava", "self"))
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    hf_specmm.enable(model)
    try:
        for extra, named in ((dict(assistant_confidence_threshold=0.4), "assistant_confidence_threshold"),
                             (dict(num_assistant_tokens_schedule="heuristic"), "num_assistant_tokens_schedule"),
                             (dict(num_assistant_tokens=5), "num_assistant_tokens=5"),
                             (dict(cache_implementation="static"), "cache_implementation='static'")):
            with pytest.raises(hf_specmm.UnsupportedGenerationError, match=named):
                model.generate(**inputs, max_new_tokens=4, assistant_model=auto, **extra)
        fixed = hf_specmm.Auto(draft("llava", "self"), shapes=[TreeShape(2, 2, 3)])
        with pytest.raises(hf_specmm.UnsupportedGenerationError, match="tree"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=fixed, return_dict_in_generate=True,
                           output_hidden_states=True)
        assert calls == []
    finally:
        handle.remove()
        hf_specmm.disable(model)
    for bad, match in ((dict(max_tokens=0), "max_tokens"), (dict(prior=[[0.8, 0.5]]), "sum"),
                       (dict(shapes=[TreeShape(8, 3, 64)], max_tokens=32), "max_tokens")):
        with pytest.raises(ValueError, match=match):
            hf_specmm.Auto(draft("llava", "self"), **bad)
    with pytest.raises(ValueError, match="already"):
        hf_specmm.Auto(hf_specmm.Tree(draft("llava", "self"), 2, 2, 3))


def test_hidden_states_outputs_take_chains_and_plain_steps_only():
    model = target("llava")
    inputs = batch_inputs("llava", 2)
    kwargs = dict(max_new_tokens=12, return_dict_in_generate=True, output_scores=True, output_hidden_states=True)
    plain = model.generate(**inputs, do_sample=False, **kwargs)
    COSTS.clear()
    auto = hf_specmm.Auto(draft("llava", "self"), max_tokens=16)
    out, stats = generate(model, inputs, assistant_model=auto, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert not any(s.startswith("tree") for s in stats.auto["shapes"]) and "chain 2" in stats.auto["shapes"]


@pytest.mark.skipif(not testing.HYBRID_FAMILIES, reason="this transformers has no Qwen3.5")
def test_linear_attention_layers_take_chains_only():
    """A target with linear-attention layers (Qwen3.5's Gated DeltaNet) takes chain rounds only: fixed shapes that
    need trees or plain steps are refused before any forward; the cost-aware policy keeps to chains."""
    family = testing.HYBRID_FAMILIES[0]
    model = testing.tiny_target(family)
    d = testing.text_draft_from_target(model)
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["describe the image", "hi"],
                                 [testing.tiny_image(0), None])
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    hf_specmm.enable(model)
    try:
        for shapes, named in (([0], "plain"), ([TreeShape(2, 2, 3)], "tree")):
            with pytest.raises(hf_specmm.UnsupportedGenerationError, match=named):
                model.generate(**inputs, max_new_tokens=4, assistant_model=hf_specmm.Auto(d, shapes=shapes))
        assert calls == []
        budget = hf_specmm.Auto(d).budget(model, 2, False, "dynamic", trees=False, plain=False,
                                          device=torch.device("cpu"))
        assert all(s.tree is None and s.gamma > 0 for s in budget.policy.shapes + budget.policy.calibration)
    finally:
        handle.remove()
        hf_specmm.disable(model)


def _always_agreeing_budget(trees: bool, tree_level_s: float = 0.1):
    """A budget of a fresh pair, calibrated on a flat verification (1 s) and 0.1 s per chain draft step (a tree
    level: ``tree_level_s``), whose acceptance table has seen the target agree with every draft."""
    from hf_specmm.auto.costs import CALIBRATION_SAMPLES

    COSTS.clear()
    model = target("llava")  # a fresh draft: a pair with no acceptance table yet
    budget = hf_specmm.Auto(testing.text_draft_from_target(model)).budget(model, 1, False, "dynamic", trees=trees,
                                                                         plain=True, device=torch.device("cpu"))
    for _ in range(CALIBRATION_SAMPLES):
        for w in range(1, 66):
            budget.costs.add("chain", w, None, 0.0, 1.0)
            budget.costs.add("tree", w, None, 0.0, 1.0)
        for g in range(1, 9):
            budget.costs.add("chain", g + 1, f"chain:{g}", 0.1 * g, 1.0)
        for k, d in ((2, 4), (4, 6), (8, 6)):
            budget.costs.add("tree", 9, f"tree:{k},{d}", 0.1 + tree_level_s * (d - 1), 1.0)
    for _ in range(400):  # chain 8: 9 / 1.8 = 5.0 tokens/s; chain 7: 8 / 1.7 = 4.7 (within 10 %); chain 6: outside
        budget.acceptance.observe_chain([8], [8])
    return budget


def _taken(budget, rounds: int) -> list:
    taken = []
    for _ in range(rounds):
        budget.open = None  # no wall-clock timing of these empty rounds
        choice = budget.for_round([100], [True])
        taken.append(choice.tree if choice.tree is not None else choice.gamma)
    return taken


def test_near_ties_are_retimed_in_turn():
    """One drafted round per exploration gap takes a shape predicted within 10 % of the best (in turn), so a
    near-tie's timings stay fresh; shapes outside the band never are. A near-tie of the best's own kind teaches no
    time factor (no contrast): the gap follows the ranking's refresh (up to 64) while the best holds."""
    budget = _always_agreeing_budget(trees=False)
    taken = _taken(budget, 256)
    explored = [i for i, g in enumerate(taken) if g != 8]
    assert set(taken) == {7, 8} and explored[:3] == [7, 23, 55], explored
    assert [b - a for a, b in zip(explored, explored[1:])][-2:] == [64, 64], explored


def test_explored_rounds_are_marked():
    """A contender taken by ``_contender``, not the ranking's best, is marked ``explored`` (``last_stats``
    reports how many rounds a call explored)."""
    budget = _always_agreeing_budget(trees=False)
    marks = []
    for _ in range(24):
        budget.for_round([100], [True])
        marks.append((budget.open["shape"].gamma, budget.open["choice"].explored))
        budget.open["tokens"] = budget.open["shape"].gamma + 1  # every draft kept, as the table expects
        budget._close(0.0, timed=False)  # logged, no wall-clock timing of these empty rounds
    assert [i for i, (_, explored) in enumerate(marks) if explored] == [7, 23], marks
    assert all(explored == (gamma != 8) for gamma, explored in marks), marks
    assert budget.report()["explored_rounds"] == 2


def test_each_cost_table_explores_at_its_own_pace():
    """A batch call's last rounds have fewer live rows and are chosen by another bucket's cost table, whose ranking
    explores at its own gap: with one count of rounds for every table, the narrow bucket's explorations (one in 8
    rounds while its factor is unsure) reset the count of the call's own table before its gap (up to 64 rounds)
    came, and on the world at batch 8 that table's other kind was never explored (1 contrast in 30 calls)."""
    budget = _always_agreeing_budget(trees=False)
    tables = {"call's": budget.costs, "narrow": CostTable(budget.costs.to_json())}
    explored = {name: [] for name in tables}
    for i in range(32):
        name = ("call's", "narrow")[i % 2]
        budget.ranked, budget.ranked_by = budget.ranking(tables[name]), tables[name]
        explored[name].append(budget._contender(budget.ranked[0]).explored)
    for name, flags in explored.items():  # the 8th and 16th rounds each table chose (the gap: its refresh, 8)
        assert [i for i, e in enumerate(flags) if e] == [7, 15], (name, flags)


def test_the_other_kind_is_explored_until_its_time_factor_has_contrasts():
    """A contender of the other kind (a tree where a chain is best) is taken every 8th drafted round, before the
    best's own near-ties, while its kind's time factor rests on fewer than SURE_CONTRASTS contrasts: only a round
    of the other kind than the one before is a contrast (on the world at batch 8, after the chains' calibration was
    timed 1.4x slow, taking turns with the best's own kind brought 1 of 8 processes back on chains within 48 calls,
    the other kind first 4 of 8). Then the gap follows the refresh."""
    from hf_specmm.auto.budget import SURE_CONTRASTS

    budget = _always_agreeing_budget(trees=True, tree_level_s=0.12)
    assert budget.ranking(budget.costs)[0].shape == Shape(8)
    taken = _taken(budget, 64)
    explored = [(i, g) for i, g in enumerate(taken) if g != 8]
    assert [i for i, _ in explored] == list(range(7, 64, 8)), explored
    assert all(isinstance(g, TreeShape) for _, g in explored), explored  # chain 7 waits for the trees' contrasts
    budget.costs.kind_ratios["tree"] = [1.0] * SURE_CONTRASTS  # now the trees' factor is known
    taken = _taken(budget, 256)
    explored = [(i, g) for i, g in enumerate(taken) if g != 8]
    gaps = [b - a for (a, _), (b, _) in zip(explored, explored[1:])]
    assert gaps[-2:] == [64, 64], explored


def test_an_answers_end_is_no_trial_and_sets_the_end_hazard():
    """A copy of the target (every draft accepted) whose rows stop at EOS inside a round's drafts: what was drafted
    past EOS is no trial (the table counts up to the end only), and the end hazard counts the answers that ended
    per kept token; rows cut by max_length are no end."""
    model = testing.tiny_target("llava", seed=5, eos_bias=2.0)
    inputs = batch_inputs("llava", 3, with_images=False)
    new = 24
    plain = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    eos = torch.tensor(model.generation_config.eos_token_id).flatten()
    generated = plain[:, inputs["input_ids"].shape[1]:]
    ended = [bool(torch.isin(row, eos).any()) for row in generated]
    auto = hf_specmm.Auto(testing.text_draft_from_target(model), shapes=[8])
    out, stats = generate(model, inputs, max_new_tokens=new, assistant_model=auto)
    assert torch.equal(out, plain)
    rounds = [(kept, gamma) for row in zip(*stats.tokens_per_round) for kept, gamma in zip(row, stats.gammas) if kept]
    assert any(0 < kept < gamma for kept, gamma in rounds) and 0 < sum(ended) < len(ended), \
        "rows must end at EOS inside a round's drafts, and some at max_length, for this test to mean anything"
    table = auto.acceptance(model)
    assert table.hits[0][0] == table.trials[0][0]  # an exact copy: nothing failed
    trials = sum(row[0] for row in table.trials)
    assert trials == sum(min(kept, gamma) for kept, gamma in rounds)  # counted: gamma in every round
    assert table.ends == [sum(ended), sum(kept for kept, _ in rounds)]
    assert 0 < table.end_hazard() < 1


def test_the_end_hazard_discounts_what_deeper_drafts_keep():
    """With answers ending at λ per kept token, a draft at depth d is kept only where the d - 1 tokens before it
    were no end: (1 - λ)^(d - 1), so a long chain expects that much less (and the policy ranks by that)."""
    from hf_specmm.auto.acceptance import END_PRIOR_TOKENS

    table = AcceptanceTable(depth=8)
    for _ in range(100):
        table.observe_chain([8], [8])
    assert table.end_hazard() == 0.0 and table.kept_probabilities(8, 2) == table.probabilities(8, 2)
    table.observe_ends(100 - END_PRIOR_TOKENS, 25)
    keep = 1.0 - table.end_hazard()
    assert keep == pytest.approx(0.75)
    plain_p, kept_p = table.probabilities(8, 2), table.kept_probabilities(8, 2)
    assert kept_p[0] == plain_p[0] and kept_p[3] == pytest.approx([p * keep for p in plain_p[3]])
    lengths, before = chain_lengths(kept_p, 8), chain_lengths(plain_p, 8)
    reach = [b - a for a, b in zip([0.0] + before, before)]  # P(the target takes drafts 1..d)
    assert lengths[7] == pytest.approx(sum(r * keep ** d for d, r in enumerate(reach)))
    policy = CostAwarePolicy(max_tokens=16, max_depth=8, trees=False)
    assert policy.expected_accepted(table)[Shape(8)] == pytest.approx(lengths[7])
