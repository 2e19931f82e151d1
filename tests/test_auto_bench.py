"""``hf_specmm.Auto`` in the bench: rank-aware controlled acceptance (``--acceptance-profile``) and
``--auto`` rows; a call that plain generate's own loop wins runs as plain generate. Timing numbers are not
asserted (speed is measured with the CLI)."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

import hf_specmm
from hf_specmm import cli
from hf_specmm.auto import COSTS
from hf_specmm.auto.acceptance import read_profile
from hf_specmm.auto.calls import PROBES_LOST
from hf_specmm.bench import BenchConfig, run_benchmark
from conftest import batch_inputs, draft, target
from test_trees_generate import generate


def test_profile_rank_zero_is_the_chain_alpha_and_trees_gain_from_lower_ranks():
    """A profile [[α]] draws the same hits as --acceptance α (a chain's τ equal); with mass at rank 1 a tree's
    τ exceeds the chain of its depth, as the profile's expected lengths say; every row lossless."""
    common = dict(preset="tiny", gammas=[3], batch_sizes=[2], max_new_tokens=40, repeats=1, warmup=0, stock=False)
    alpha = run_benchmark(BenchConfig(acceptance=0.7, **common), progress=False)["rows"][0]
    flat = run_benchmark(BenchConfig(acceptance_profile=[[0.7]], **common), progress=False)["rows"][0]
    assert flat["tau"] == pytest.approx(alpha["tau"]) and flat["expected_tau"] == pytest.approx(alpha["expected_tau"])
    ranked = run_benchmark(BenchConfig(acceptance_profile=[[0.5, 0.4], [0.5, 0.4], [0.5, 0.4]], trees=[[2, 3, 10]],
                                       auto=True, auto_max_tokens=16, auto_eval_repeats=2, **common),
                           progress=False)["rows"]
    chain, tree, auto = ranked
    assert chain.get("tree") is None and tree["tree"] == "2,3,10" and auto["tree"] == "auto"
    assert tree["tau"] > chain["tau"] + 0.5, (tree["tau"], chain["tau"])
    assert all(row["lossless"] is True for row in ranked)
    # the evaluation: the faster grid row re-timed beside Auto and plain, in turns (2 passes each)
    best = max((chain, tree), key=lambda r: r["speedup"])
    assert auto["best_fixed"] == ("chain 3" if best is chain else "2,3,10"), (auto["best_fixed"], best["speedup"])
    assert auto["eval"]["lossless"] is True and auto["eval"]["repeats"] == 2
    assert all(len(v) == 2 for v in auto["eval"]["times_s"].values()) and sum(auto["eval"]["auto_shapes"].values())
    times = auto["eval"]["times_s"]  # paired: the median over passes of Auto's time over the best row's
    assert auto["auto_over_best"] == pytest.approx(statistics.median(a / b for a, b in zip(times["auto"], times["best"])))
    assert auto["eval"]["auto_speedup"] == pytest.approx(
        statistics.median(p / a for p, a in zip(times["plain"], times["auto"])))
    assert auto["eval"]["auto_over_best_of_medians"] == pytest.approx(
        statistics.median(times["auto"]) / statistics.median(times["best"]))
    assert "best_fixed" not in chain and "auto_over_best" not in tree
    assert auto["auto_shapes"] and auto["auto_calibration_calls"] >= 1
    learned = auto["auto_acceptance"]  # the profile, learned back from the rounds
    # rank 0 is seen in every round; rank 1 only in tree rounds, whose number follows the measured costs: the
    # estimate moves from its prior (0.4 × rank 0's hazard: ~0.1 here) toward 0.4 as trees are taken
    assert abs(learned[0][0] - 0.5) < 0.2 and 0.15 < learned[0][1] < 0.6, learned


def test_profile_argument_numbers_and_files(tmp_path, capsys):
    assert read_profile("0.8,0.1;0.7") == [[0.8, 0.1], [0.7]]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"draft": "text_only", "profile": [[0.6, 0.2]]}))
    assert read_profile(str(path)) == [[0.6, 0.2]]
    with pytest.raises(ValueError, match=r"\.json file, got '\{.*\.\.\.'$"):  # a file's text, not its path: cut
        read_profile(json.dumps({"profile": [[0.5] * 8] * 8}, indent=1) * 20)
    for bad in ("0.8,0.5", "abc", str(tmp_path / "missing.json")):
        with pytest.raises(SystemExit) as info:
            cli.main(["bench", "--preset", "tiny", "--acceptance-profile", bad, "--out", str(tmp_path)])
        assert info.value.code == 2
        assert "--acceptance-profile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--preset", "tiny", "--acceptance-profile", "0.5", "--acceptance", "0.5",
                  "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--preset", "tiny", "--auto", "--auto-eval-repeats", "-1", "--out", str(tmp_path)])
    assert info.value.code == 2 and "--auto-eval-repeats" in capsys.readouterr().err
    with pytest.raises(ValueError, match="auto_eval_repeats=-1"):
        run_benchmark(BenchConfig(preset="tiny", auto=True, auto_eval_repeats=-1), progress=False)
    with pytest.raises(ValueError, match="acceptance and acceptance_profile"):
        run_benchmark(BenchConfig(preset="tiny", acceptance=0.5, acceptance_profile=[[0.5]]), progress=False)


def test_a_call_plain_generate_wins_runs_as_plain_generate():
    """Once plain generate's whole calls are measured faster than the speculative ones, calls run stock's loop
    without the draft (the output is plain generate's); the 8th after the switch still runs speculatively."""
    model = target("llava")
    inputs = batch_inputs("llava", 2, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    COSTS.clear()
    auto = hf_specmm.Auto(draft("llava", "random"), max_tokens=8, max_depth=3)
    while True:  # calibrate
        out, stats = generate(model, inputs, max_new_tokens=12, assistant_model=auto)
        if stats.auto["calibration_rounds"] == 0 and stats.auto["shapes"] != ["plain generate"]:
            break
    (table,) = COSTS.tables.values()
    assert table.overheads and all(o > 0 for o in table.overheads) and set(table.lengths) == {11.0}  # whole calls
    assert table.stock and table.stock_calls  # one call ran as plain generate once calibrated: its steps timed
    measured = list(table.stock)
    table.stock_share = lambda: 1e-9  # plain generate's calls measured (as) free beside the speculative ones
    table_of_pair = auto.acceptance(model)
    table_of_pair.regimes.clear()  # whatever the calibration calls left: plain generate's first choice starts its gap
    # and, where the random draft's ranking is plain steps (timing decides), its probes lost: the same schedule
    table_of_pair.probes_lost, table_of_pair.probe_won = PROBES_LOST, None
    shapes, choices = [], []
    for _ in range(9):
        out, stats = generate(model, inputs, max_new_tokens=12, assistant_model=auto)
        assert torch.equal(out, plain)
        shapes.append(stats.auto["shapes"][0] if stats.auto["shapes"] == ["plain generate"] else "speculative")
        choices.append(stats.auto["whole_call"])  # how each call was chosen: the rule, the share, a check or not
    assert shapes == ["plain generate"] * 7 + ["speculative", "plain generate"], shapes
    assert [c["plain_generate"] for c in choices] == [s == "plain generate" for s in shapes]
    assert [c["check"] for c in choices] == [s == "speculative" for s in shapes]
    for c in choices:  # by the (faked) share, or by a ranking of plain steps, which reads no share
        assert (c["by"], c["share"]) in (("share", 1e-9), ("plain steps ranked first", None)), c
    assert table.stock != measured and all(t > 0 for t in table.stock)  # the plain calls' steps were timed


def test_a_call_whose_rounds_would_all_be_plain_steps_runs_as_plain_generate():
    """Where the loop would take plain steps only (a useless draft), plain generate's own loop does the same
    cheaper: the call runs as plain generate however slow its step was once measured (noise must not keep the
    loop's costlier plain steps)."""
    model = target("llava")
    inputs = batch_inputs("llava", 1, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    COSTS.clear()
    auto = hf_specmm.Auto(draft("llava", "random"), max_tokens=8, max_depth=3)
    for _ in range(8):  # calibrate
        generate(model, inputs, max_new_tokens=12, assistant_model=auto)
    (table,) = COSTS.tables.values()
    for kind, widths in table.verify.items():  # costs that grow with width and drafting (no timing noise)
        for width in widths:
            widths[width] = [0.01 * width] * 3
    for label in table.draft:
        table.draft[label] = [0.01] * 3
    table.kind_ratios.clear()  # and no realised factors learned against the timed curves
    table.speed = 1.0
    table.version += 1
    table.stock_step_time = lambda: 1e3  # plain generate's step measured (as) very slow
    pair = auto.acceptance(model)
    pair.regimes.clear()
    pair.probes_lost, pair.probe_won = PROBES_LOST, None  # the probes' evidence (timing decides it in calibration)
    out, stats = generate(model, inputs, max_new_tokens=12, assistant_model=auto)
    assert torch.equal(out, plain) and stats.auto["shapes"] == ["plain generate"]
    assert stats.auto["whole_call"] == {"plain_generate": True, "by": "plain steps ranked first", "share": None,
                                        "check": False}


def test_auto_diag_script_runs_every_method_and_prints_the_cost_table(capsys):
    """benchmarks/auto_diag.py is what a GPU run starts with (gpu_bench.sh ad): it must not fail there."""
    module = benchmark_script("auto_diag")
    COSTS.clear()
    from hf_specmm.auto.budget import AutoBudget

    methods = AutoBudget.drafted, AutoBudget.observe
    assert module.main(["--preset", "tiny", "--max-new-tokens", "24", "--auto-calls", "1", "--turns", "1",
                        "--slow-calibration", "0.001"]) == 0
    assert (AutoBudget.drafted, AutoBudget.observe) == methods  # the emulation is undone
    out = capsys.readouterr().out
    for line in ("chain 5 ", "Auto [5] ", "Auto [0, 5] ", "Auto [5, tree 4,6,32] ", "verification ms by width:",
                 "drafting ms by shape:", "realised shares:"):
        assert line in out, line
    COSTS.clear()


def test_the_world_bench_times_as_many_prompts_as_asked():
    """benchmarks/auto_world.py --prompts N: N prompts over every task (it once drew 27 for 32: four tasks assumed)."""
    from hf_specmm.world.tasks import TASKS

    module = benchmark_script("auto_world")
    for prompts in (1, 8, 32):
        examples, per_task = module.evaluation_examples(prompts)
        assert len(examples) == prompts and per_task * len(TASKS) >= prompts
        assert len({(e.image_sha, e.prompt) for e in examples}) == prompts
        if prompts >= 2 * len(TASKS):
            assert {e.task for e in examples} == set(TASKS)
    held = module.heldout_examples(examples, 2 * per_task)
    assert len(held) == 32 and not {(e.image_sha, e.prompt) for e in held} & {(e.image_sha, e.prompt) for e in examples}


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
