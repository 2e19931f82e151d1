"""``hf-specmm auto-sim`` / ``hf_specmm.auto.simulate``: Auto's own budget on a virtual clock beside every fixed
shape. Fixed shapes equal their closed forms, runs are deterministic per seed, bad profiles are refused naming
the key, and Auto meets its goals on shipped profiles (a reduced number of calls)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hf_specmm import cli
from hf_specmm.auto import check_sim_profile, simulate
from hf_specmm.auto.shapes import Shape
from hf_specmm.simulator import Machine
from hf_specmm.trees.expand import TreeShape

PROFILES = Path(__file__).resolve().parents[1] / "benchmarks" / "profiles"


def flat(alpha: float = 0.7, **extra) -> dict:
    profile = {"verify_ms": {"1": 10, "9": 18}, "draft_ms": {"first": 2, "step": 1}, "overhead_ms": {"round": 0.5},
               "acceptance": alpha, "answer_tokens": [3000, 3000]}
    profile.update(extra)
    return profile


def test_fixed_chains_equal_the_closed_forms():
    """A chain of γ with one α: (1 − α^(γ+1)) / (1 − α) tokens per round, verify(γ+1) + first + (γ−1)·step +
    overhead ms per round."""
    alpha = 0.7
    result = simulate(flat(alpha), calls=2, seed=3, max_tokens=4, max_depth=4)
    machine = Machine(check_sim_profile(flat(alpha)), 0)
    for gamma in (1, 2, 4):
        round_ms = 10 + 8 * gamma / 8 + 2 + (gamma - 1) * 1 + 0.5
        assert machine.seconds(Shape(gamma), 1) == pytest.approx(round_ms / 1e3)
        tau = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        assert result["fixed"][f"chain {gamma}"] == pytest.approx(tau / (round_ms / 1e3), rel=0.03), gamma
    assert result["fixed"]["plain"] == pytest.approx(1 / 0.010, rel=1e-3)  # plain generate: no round overhead


def test_a_tree_accepts_only_the_listed_ranks():
    """One α is rank 0 alone: a tree's further ranks are never the target's token (α 0: nothing is accepted)."""
    tree = Shape(3, TreeShape(4, 3, 16))
    for alpha in (0.0, 0.7):
        machine = Machine(check_sim_profile(flat(alpha)), 0)
        draws = [machine.accepted(tree, [[alpha]]) for _ in range(2000)]
        first = sum(n >= 1 for n, _ in draws) / len(draws)  # the root's rank-0 child is in every tree
        assert first == pytest.approx(alpha, abs=0.04), alpha


def test_runs_are_deterministic_per_seed_and_report_every_key():
    profile = json.loads((PROFILES / "tiny-text-only.json").read_text())
    profile["noise"] = 0.1
    a = simulate(profile, calls=12, seed=1, max_tokens=16, max_depth=4)
    assert a == simulate(profile, calls=12, seed=1, max_tokens=16, max_depth=4)
    assert a != simulate(profile, calls=12, seed=2, max_tokens=16, max_depth=4)
    assert {"auto_over_best", "auto_over_plain", "best_shape", "fixed", "auto_tokens_per_s"} <= set(a)
    assert a["fixed"][a["best_shape"]] == max(a["fixed"].values()) and "tree 4,3,16" in a["fixed"]
    assert len(a["auto_shapes_by_call"]) == 12


@pytest.mark.parametrize("change, key", [
    (dict(verify_ms=None), "verify_ms"), (dict(draft_ms=None), "draft_ms"), (dict(acceptance=None), "acceptance"),
    (dict(verify_ms={"1": -1}), "verify_ms.1"), (dict(verify_ms={"0": 1}), "verify_ms"),
    (dict(overhead_ms={"round": float("inf")}), "overhead_ms.round"), (dict(colour=1), "colour"),
    (dict(acceptance=[[0.8, 0.5]]), "acceptance"), (dict(acceptance=[0.5]), "acceptance"),
    (dict(acceptance_drift=[[10, 2.0]]), "acceptance_drift"), (dict(answer_tokens=[5, 2]), "answer_tokens"),
    (dict(cold={"factor": 2}), "cold"), (dict(drift=[[-1, 2.0]]), "drift")])
def test_bad_profiles_are_refused_naming_the_key(change, key, tmp_path, capsys):
    profile = flat()
    for k, v in change.items():
        if v is None:
            profile.pop(k)
        else:
            profile[k] = v
    with pytest.raises(ValueError, match=f"'{key}'"):
        check_sim_profile(profile)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    assert cli.main(["auto-sim", "--profile", str(path), "--calls", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err


def test_the_cli_prints_a_last_line_and_json(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    assert cli.main(["auto-sim", "--profile", str(path)]) == 2
    assert "p.json" in capsys.readouterr().err
    path.write_text(json.dumps(flat(answer_tokens=[8, 24])))
    assert cli.main(["auto-sim", "--profile", str(path), "--calls", "6", "--skip", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("auto-sim: auto/best=") and " auto/plain=" in last and " best=" in last
    assert cli.main(["auto-sim", "--profile", str(path), "--calls", "6", "--batch", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batch"] == 2 and data["skip"] == 0 and data["fixed"]["plain"] > 0


@pytest.mark.parametrize("name", ["h200-llava-7b-feature-head", "tiny-text-only", "cpu-proxy-text-only"])
def test_auto_meets_its_goals_on_shipped_profiles(name):
    """Reduced from docs/auto.md's goals (400 calls, 5 seeds): 120 calls, one seed, the first 40 left out."""
    result = simulate(str(PROFILES / f"{name}.json"), calls=120, seed=0, skip=40)
    assert result["auto_over_best"] >= 0.93 and result["auto_over_plain"] >= 0.97, result["auto_over_best"]


def test_after_the_acceptance_falls_to_zero_auto_runs_plain_generate():
    profile = json.loads((PROFILES / "tiny-text-only.json").read_text())
    profile["acceptance_drift"] = [[20, 0.0]]
    profile["overhead_ms"]["round"] = 0.0  # drafting pays before the drift
    result = simulate(profile, calls=70, seed=0, skip=40)
    assert result["best_shape"] == "plain" and result["auto_over_plain"] >= 0.95
    assert result["auto_shapes_by_call"][-20:] == ["plain generate"] * 20


def test_every_shipped_profile_is_what_its_source_command_writes(tmp_path, monkeypatch):
    """A shipped profile's ``source`` is the ``--from-bench`` command that writes it from measured runs in the tree:
    run again, it writes the same file."""
    monkeypatch.chdir(PROFILES.parents[1])  # the commands name paths from the repository root
    shipped = sorted(PROFILES.glob("*.json"))
    assert len(shipped) == 15
    for path in shipped:
        profile = json.loads(path.read_text())
        words = shlex.split(profile["source"])
        assert words[:3] == ["hf-specmm", "auto-sim", "--from-bench"], path.name
        out = tmp_path / path.name
        assert cli.main(words[1:] + ["--write-profile", str(out)]) == 0, path.name
        assert json.loads(out.read_text()) == profile, path.name


@pytest.mark.parametrize("extra, words", [
    (["--cold", "3", "2.5"], ["--cold", "ROUNDS", "2.5"]), (["--cold", "-1", "3"], ["'cold.factor'"]),
    (["--answer-tokens", "48", "8"], ["'answer_tokens'", "[48, 8]"]), (["--draft-kind", "dflash"], ["'dflash'"]),
    (["--acceptance", "1.5"], ["'acceptance'"]), (["--acceptance", "missing.json"], ["missing.json"])])
def test_from_bench_refuses_bad_options_in_one_line_and_writes_nothing(extra, words, tmp_path, capsys):
    bench = PROFILES.parents[1] / "benchmarks" / "results" / "profile-timings" / "tiny-batch-1-4.json"
    out = tmp_path / "p.json"
    args = ["auto-sim", "--from-bench", str(bench), "--draft-kind", "text_only", "--write-profile", str(out)]
    assert cli.main(args + extra) == 2  # a repeated option (--draft-kind) takes its last value
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words) and "Traceback" not in err, err
    assert not out.exists()


def test_from_bench_options_need_from_bench_and_a_missing_run_is_named(tmp_path, capsys):
    assert cli.main(["auto-sim", "--profile", str(PROFILES / "tiny-text-only.json"), "--cold", "3", "3"]) == 2
    assert "--cold" in capsys.readouterr().err
    missing = tmp_path / "nowhere.json"
    assert cli.main(["auto-sim", "--from-bench", str(missing), "--draft-kind", "text_only", "--write-profile",
                     str(tmp_path / "p.json")]) == 2
    assert "nowhere.json" in capsys.readouterr().err


def test_a_profiles_acceptance_is_the_median_of_its_chains_and_none_is_refused(tmp_path, capsys):
    """Both writers (``bench --write-profile``, ``auto-sim --from-bench``) take a run's acceptance as the median of
    its chain rows' (an even count: the mean of the middle two); a run without any is refused, naming the fix."""
    from hf_specmm.bench.sim_profile import profile_from_rows

    bench = PROFILES.parents[1] / "benchmarks" / "results" / "profile-timings" / "tiny-batch-1-4.json"
    rows = json.loads(bench.read_text())["rows"]
    chains = [r for r in rows if not r.get("tree")]
    for r, alpha in zip(chains, [0.1, 0.2, 0.3, 0.4] * len(chains)):
        r["acceptance"] = alpha
    assert len(chains) % 4 == 0
    assert profile_from_rows(rows, "text_only", None, "test")["acceptance"] == pytest.approx(0.25)
    for r in chains:
        r["acceptance"] = None
    with pytest.raises(ValueError, match="--acceptance"):
        profile_from_rows(rows, "text_only", None, "test")
    runs, out = tmp_path / "bench.json", tmp_path / "p.json"
    runs.write_text(json.dumps({"rows": rows}))
    assert cli.main(["auto-sim", "--from-bench", str(runs), "--draft-kind", "text_only", "--write-profile",
                     str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--acceptance" in err and not out.exists()
    assert cli.main(["auto-sim", "--from-bench", str(runs), "--draft-kind", "text_only", "--acceptance", "0.5",
                     "--write-profile", str(out)]) == 0
    assert json.loads(out.read_text())["acceptance"] == 0.5
