"""``hf_specmm.Auto`` in the bench: rank-aware controlled acceptance (``--acceptance-profile``), ``--auto`` rows
and ``--write-profile``. Timing numbers are not asserted (speed is measured with the CLI)."""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import Counter

import pytest
import torch

import hf_specmm
from hf_specmm import cli
from hf_specmm.bench.cli import read_profile
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
    # every Auto call recorded in order (untimed first), its rounds per shape adding up to the timed calls' shapes
    row_shapes = {label: int(n) for label, n in re.findall(r"(.+?) \((\d+)\)(?:, |$)", auto["auto_shapes"])}
    untimed = auto["auto_calibration_calls"]
    for calls, timed, taken in ((auto["auto_calls"], 1, row_shapes),  # the grid row's repeats; the evaluation's
                                (auto["eval"]["auto_calls"], 2, auto["eval"]["auto_shapes"])):
        assert len(calls) == untimed + timed, len(calls)
        assert all(c["seconds"] > 0 and c["rounds"] and isinstance(c["whole_call"]["plain_generate"], bool)
                   for c in calls), calls
        assert all(c["whole_call"]["plain_generate"] == ("plain generate" in c["rounds"]) for c in calls), calls
        counted = sum((Counter(c["rounds"]) for c in calls[untimed:]), Counter())
        assert {k: counted[k] for k in taken} == taken and len(counted) >= len(taken), (calls, taken)  # row: top 4
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


def test_the_world_bench_runs_and_reports_its_spread(tmp_path, capsys):
    """benchmarks/auto_world.py end to end on one prompt, two runs, the useless draft: every run's row recorded
    (outputs equal to plain), the spread table printed; bad counts refused before any model loads."""
    module = benchmark_script("auto_world")
    with pytest.raises(SystemExit) as info:
        module.main(["--runs", "0", "--out", str(tmp_path / "x")])
    assert info.value.code == 2 and "--runs must be >= 1" in capsys.readouterr().err and not (tmp_path / "x").exists()
    module.main(["--prompts", "1", "--repeats", "1", "--eval-repeats", "1", "--runs", "2", "--batch-sizes", "1",
                 "--chains", "1", "3", "--trees", "2,2,4",
                 "--drafts", "text-only (untrained)", "--out", str(tmp_path / "w")])
    rows = json.loads((tmp_path / "w" / "world_bench.json").read_text())["rows"]
    assert [r["run"] for r in rows] == [0, 1] and all(r["lossless"] for r in rows)
    assert "| text-only (untrained) | 1 | 2 |" in capsys.readouterr().out


def test_the_simulator_goals_script_runs_one_profile(tmp_path):
    """benchmarks/auto_sim_goals.py on one profile, one seed, no drift: one row with the goal figures."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "auto_sim_goals.py"), "--out",
                           str(tmp_path / "g.json"), "--profiles", "tiny-text-only", "--seeds", "1", "--drift-seeds",
                           "0", "--batches", "1", "--calls", "60"], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "g.json").read_text())["rows"]
    assert row["profile"] == "tiny-text-only" and 0 < row["auto_over_best"] <= 1.0 + 1e-9
    assert set(row["first_20"]) >= {"auto_over_best", "auto_over_plain"}
    assert "tiny-text-only" in done.stdout
    row["a1b2c3d"] = {"auto_over_best": 0.5, "auto_over_plain": 0.5, "first_20": {"auto_over_best": 0.25}}
    (tmp_path / "g.json").write_text(json.dumps({"rows": [row]}))
    shown = subprocess.run([sys.executable, str(root / "benchmarks" / "auto_sim_goals.py"), "--table",
                            str(tmp_path / "g.json")], capture_output=True, text=True, cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)})
    assert shown.returncode == 0, shown.stderr
    assert f"| tiny-text-only | 1 | {row['best_shape']} (" in shown.stdout and "| 0.500, 0.250 (1) |" in shown.stdout
    steady = row["auto_over_best"] >= 0.95 and row["auto_over_plain"] >= 0.98
    assert f"Goals met: steady {int(steady)} of 1" in shown.stdout and "drifts 0 of 0" in shown.stdout


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_write_profile_replays_in_the_simulator(tmp_path):
    """``hf-specmm bench --write-profile``: a profile from the run's fixed-shape timings that auto-sim takes."""
    from hf_specmm.auto import check_sim_profile, simulate

    path = tmp_path / "p.json"
    assert cli.main(["bench", "--preset", "tiny", "--gammas", "1", "3", "--tree", "2,3,6", "--batch-sizes", "1",
                     "--max-new-tokens", "12", "--repeats", "1", "--warmup", "0", "--no-stock", "--acceptance", "0.6",
                     "--out", str(tmp_path / "out"), "--write-profile", str(path)]) == 0
    profile = json.loads(path.read_text())
    check_sim_profile(profile)
    assert set(profile["verify_ms"]) == {"1", "2", "4", "7"} and profile["acceptance"] == 0.6
    assert profile["draft_ms"]["step"] > 0 and profile["answer_tokens"] == [12, 12]
    assert simulate(profile, calls=3, max_tokens=8, max_depth=3)["auto_tokens_per_s"] > 0
