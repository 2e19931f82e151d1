"""The benchmark runs every mode on the tiny preset; controlled acceptance reproduces the expected τ.

Timing numbers are not asserted (speed is measured with the CLI, not in unit tests)."""

from __future__ import annotations

import json

import pytest

from hf_specmm import cli
from hf_specmm.bench import BenchConfig, run_benchmark


def test_controlled_acceptance_reproduces_expected_tau():
    """Independent per-token acceptance α gives τ = (1 - α^(γ+1)) / (1 - α) per round."""
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], batch_sizes=[3], acceptance=0.6,
                                       max_new_tokens=120, repeats=1, warmup=0, stock=False), progress=False)
    (row,) = result["rows"]
    assert row["expected_tau"] == pytest.approx((1 - 0.6 ** 4) / 0.4)
    print(f"measured τ {row['tau']:.3f} vs expected {row['expected_tau']:.3f}, acceptance {row['acceptance']:.3f}")
    assert abs(row["tau"] - row["expected_tau"]) < 0.2
    assert row["lossless"] is True


@pytest.mark.parametrize("alpha,gamma", [(1.0, 4), (0.0, 3)])
def test_controlled_acceptance_extremes(alpha, gamma):
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[gamma], batch_sizes=[1], acceptance=alpha,
                                       max_new_tokens=31, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    assert row["tau"] == (gamma + 1 if alpha == 1.0 else 1.0)
    assert row["acceptance"] == alpha
    assert row["lossless"] is True
    # batch 1, same vocabulary: stock assisted generation ran, or says why not (5.17 hands the draft pixel_values)
    assert (row["stock_speedup"] is not None) != (row["stock_error"] is not None)
    if row["stock_error"]:
        assert "pixel_values" in row["stock_error"]
    else:  # stock ran with the same γ (set on the draft's config: stock ignores generate()'s value)
        assert row["stock_tau"] == pytest.approx(gamma + 1 if alpha == 1.0 else 1.0, rel=0.15)
    for key in ("T1_ms", "Tv_ms", "Td_ms", "ideal_speedup", "efficiency", "mbsu", "speedup"):
        assert row[key] > 0, key
    assert row["mbsu"] < row["tau"] + 1e-9


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "bench"
    code = cli.main(["bench", "--preset", "tiny", "--gammas", "1", "3", "--batch-sizes", "1", "2",
                     "--acceptance", "0.8", "--max-new-tokens", "12", "--repeats", "1", "--warmup", "0",
                     "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "hf_specmm ×" in printed and "MBSU" in printed and "systems benchmark" in printed
    data = json.loads((out / "bench.json").read_text())
    assert [(r["batch"], r["gamma"]) for r in data["rows"]] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(r["stock_speedup"] is None for r in data["rows"] if r["batch"] > 1)  # stock: batch 1 only
    assert "n/a" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sampling_mode_runs_and_bad_flags_are_refused(tmp_path, capsys):
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[2], do_sample=True, max_new_tokens=8, repeats=1,
                                       warmup=0), progress=False)
    assert result["rows"][0]["lossless"] is None  # sampled outputs are compared in distribution by the tests
    with pytest.raises(SystemExit) as exc:  # one line on stderr, exit code 2, before any model is built
        cli.main(["bench", "--preset", "tiny", "--acceptance", "0.5", "--do-sample", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "greedy" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown preset"):
        run_benchmark(BenchConfig(preset="nope"), progress=False)


def test_device_map_auto_dispatches_the_target_and_stays_lossless(tmp_path, capsys):
    """``--device-map auto``: the target goes through accelerate's dispatch (here: every layer on the CPU, the
    only device; on a GPU machine over the GPUs) and the run stays token-identical to plain generate."""
    out = tmp_path / "bench"
    code = cli.main(["bench", "--preset", "tiny", "--device-map", "auto", "--gammas", "3", "--acceptance", "0.8",
                     "--max-new-tokens", "12", "--repeats", "1", "--warmup", "0", "--no-stock", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["env"]["config"]["device_map"] == "auto" and data["env"]["target_device_map"]  # really dispatched
    assert data["rows"][0]["lossless"] is True
    with pytest.raises(SystemExit) as exc:  # argparse: one line, exit code 2, before any model is built
        cli.main(["bench", "--preset", "tiny", "--device-map", "everywhere", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--device-map" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device_map='everywhere'"):
        run_benchmark(BenchConfig(preset="tiny", device_map="everywhere"), progress=False)
