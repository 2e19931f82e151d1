"""``hf_specmm.Auto`` inside ``generate``: rounds that switch between plain steps, chains and trees keep every
draft kind's caches right (greedy output equal to plain generate, exact copies accepted along every drafted
round's whole depth); sampling keeps the target's distribution (χ²); costs files are checked and written safely;
bad arguments are refused at ``Auto(...)`` or before any forward, naming the argument. The estimators and the
decision rule are tested on numbers in test_auto_rule.py, the simulator in test_auto_sim.py.
"""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.auto import COSTS, MAX_DEPTH
from hf_specmm.trees import TreeShape
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
def test_auto_equals_plain_and_learns_which_draft_is_useful(family):
    """Four calls each with a useful and a useless draft: outputs equal plain's, the report adds up, and the
    learned acceptance tells the two drafts apart."""
    model = target(family)
    inputs = batch_inputs(family, 3, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    COSTS.clear()
    first_choice = {}
    for kind in ("self", "random"):
        auto = hf_specmm.Auto(draft(family, kind), max_tokens=8, max_depth=4)
        for call in range(4):
            out, stats = generate(model, inputs, max_new_tokens=24, assistant_model=auto)
            assert torch.equal(out, plain), f"{family} {kind} call {call}"
            report = stats.auto
            if report["shapes"] == ["plain generate"]:  # the call ran as plain generate
                assert report["whole_call"]["plain_generate"]
                continue
            assert len(report["shapes"]) == len(stats.gammas) and report["cost_key"]
            assert sum(s["rounds"] for s in report["per_shape"].values()) == len(stats.gammas)
        first_choice[kind] = auto.acceptance(model).probabilities(1, 1)[0][0]
        # the pair's acceptance is the process's: another Auto around the same draft starts from it
        assert hf_specmm.Auto(draft(family, kind)).acceptance(model) is auto.acceptance(model)
    assert first_choice["self"] > 0.8 > 0.3 > first_choice["random"], first_choice


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
    assert not any(s.startswith("tree") for s in stats.auto["shapes"])


@pytest.mark.skipif(not testing.HYBRID_FAMILIES, reason="this transformers has no Qwen3.5")
def test_linear_attention_layers_take_chains_only():
    """A target with linear-attention layers (Qwen3.5's Gated DeltaNet) takes chain rounds only: fixed shapes that
    need trees or plain steps are refused before any forward; the budget keeps to chains."""
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
        assert budget.shapes and all(s.tree is None and s.gamma > 0 for s in budget.shapes)
    finally:
        handle.remove()
        hf_specmm.disable(model)


def test_costs_file_round_trip_and_merge(tmp_path):
    """Each call merges its tables into the file; a later process starts from them; another model's entries and
    another writer's keys are kept."""
    model = target("llava")
    inputs = batch_inputs("llava", 1, with_images=False)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"Other(x, 1 params) | Draft(y, 2 params) | cpu": {"anything": 1}}))
    COSTS.clear()
    auto = hf_specmm.Auto(draft("llava", "self"), max_tokens=8, max_depth=3, costs_file=path)
    for _ in range(3):  # enough rounds to time a shape past its width's untimed first rounds
        generate(model, inputs, max_new_tokens=32, assistant_model=auto)
    saved = json.loads(path.read_text())
    assert "Other(x, 1 params) | Draft(y, 2 params) | cpu" in saved  # another model's entry, untouched
    (key,) = [k for k in saved if "batch<=1" in k]
    assert saved[key]["version"] == 4 and saved[key]["arms"]
    assert all(len(v) == 5 for v in saved[key]["arms"].values())
    # the second call ran as plain generate (each kind once); the first speculative call is not timed
    assert len(saved[key]["calls"]["plain"]) == 4 and len(saved[key]["calls"].get("speculative", [0] * 4)) == 4
    COSTS.clear()
    again = hf_specmm.Auto(draft("llava", "self"), max_tokens=8, max_depth=3, costs_file=path)
    budget = again.budget(model, 1, False, "dynamic", True, True, torch.device("cpu"))
    assert budget.table.arms == {k: pytest.approx(v) for k, v in saved[key]["arms"].items()}
    assert not list(tmp_path.glob("*.tmp"))  # the temporary files were renamed into place


def test_bad_costs_files_are_refused_before_any_forward_naming_file_and_key(tmp_path):
    model = target("llava")
    inputs = batch_inputs("llava", 1, with_images=False)
    d = draft("llava", "self")
    path = tmp_path / "costs.json"
    good = hf_specmm.Auto(d, costs_file=path)
    COSTS.clear()
    generate(model, inputs, max_new_tokens=8, assistant_model=good)
    (key,) = json.loads(path.read_text())
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for text, match in (("{not json", "cannot be read as JSON"), ("[1, 2]", "JSON object"),
                            (json.dumps({key: {"version": 4, "arms": {"chain 2": [1, 2]}}}), "chain 2"),
                            (json.dumps({key: {"version": 4, "arms": {"chain x": [1] * 5}}}), "unknown arm"),
                            (json.dumps({key: {"version": 4, "arms": {"plain": [1, 1, 1, 1, float("nan")]}}}),
                             "finite"),
                            (json.dumps({key: {"version": 4, "arms": {"plain": [1, 1, 1, 1]}}}), "not 5 finite"),
                            (json.dumps({key: {"arms": {"plain": [1, 1, 1, 1]}}}), "an earlier hf_specmm"),
                            (json.dumps({key: {"version": 2, "arms": {}}}), "not 4 .an earlier hf_specmm"),
                            (json.dumps({key: {"version": 4, "arms": {"plain": [1, 2, 1, 1, 1]}}}), "prior rounds at most"),
                            (json.dumps({key: {"version": 4, "calls": {"speculative": [1, 1, 1]}}}), "not 4 finite"),
                            (json.dumps({key: {"version": 4, "calls": {"plain": [1, 1, 1]}}}), "not 4 finite"),
                            (json.dumps({key: []}), "object")):
            path.write_text(text)
            COSTS.clear()
            with pytest.raises(ValueError, match=match) as error:
                generate(model, inputs, max_new_tokens=4, assistant_model=hf_specmm.Auto(d, costs_file=path))
            assert str(path) in str(error.value)
        assert calls == []
    finally:
        handle.remove()
    for bad, exc, match in ((123, TypeError, "costs_file must be a path"), (tmp_path, ValueError, "directory")):
        with pytest.raises(exc, match=match):
            hf_specmm.Auto(d, costs_file=bad)


def test_a_costs_file_that_cannot_be_saved_warns_once_and_the_call_returns(tmp_path):
    model = target("llava")
    inputs = batch_inputs("llava", 1, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    auto = hf_specmm.Auto(draft("llava", "self"), costs_file=blocker / "sub" / "costs.json")  # under a file
    COSTS.clear()
    with pytest.warns(RuntimeWarning, match="could not save") as caught:
        out, _ = generate(model, inputs, max_new_tokens=8, assistant_model=auto)
        out2, _ = generate(model, inputs, max_new_tokens=8, assistant_model=auto)
    assert torch.equal(out, plain) and torch.equal(out2, plain)
    assert len([w for w in caught if "could not save" in str(w.message)]) == 1


def test_concurrent_saves_lose_no_key_and_leave_valid_json(tmp_path):
    """Writers in threads (each its own store, as processes are) merge under the lock: every key survives."""
    import threading

    from hf_specmm.auto.costs import Table
    from hf_specmm.auto.store import Store

    path = tmp_path / "costs.json"

    def writer(i: int) -> None:
        store = Store()
        for j in range(5):
            store.tables[f"key {i}.{j}"] = Table({"arms": {"plain": [1, 1, 1, 1, 0.01]}})
            store.save(path, [f"key {i}.{j}"])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(json.loads(path.read_text())) == {f"key {i}.{j}" for i in range(6) for j in range(5)}


def test_auto_arguments_are_refused_naming_the_argument():
    d = draft("llava", "self")
    for bad, match in ((dict(shapes=[1.5]), "1.5"), (dict(shapes="38"), "list"), (dict(shapes=["a"]), "'a'"),
                       (dict(shapes=[None]), "None"), (dict(shapes=[(2, 3, 5)]), r"\(2, 3, 5\)"),
                       (dict(shapes=[]), "non-empty"), (dict(max_depth=MAX_DEPTH + 1), f"<= {MAX_DEPTH}"),
                       (dict(max_depth=100000), "max_depth"), (dict(max_tokens=0), "max_tokens"),
                       (dict(prior=[[0.8, 0.5]]), "sum"), (dict(shapes=[TreeShape(8, 3, 64)], max_tokens=32),
                                                            "max_tokens")):
        with pytest.raises(ValueError, match=match):
            hf_specmm.Auto(d, **bad)
    model = target("llava")
    vocab = model.config.get_text_config().vocab_size
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        wide = hf_specmm.Auto(d, max_tokens=4 * vocab, shapes=[TreeShape(vocab + 1, 2, vocab + 2)])
        with pytest.raises(ValueError, match="top_k"):
            generate(model, batch_inputs("llava", 1), max_new_tokens=4, assistant_model=wide)
        assert calls == []
    finally:
        handle.remove()
