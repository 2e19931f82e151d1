"""The tools kept in ``benchmarks/``: each answers ``--help`` and runs on a tiny preset or model (their numbers are
benchmarks' business; here they must run, and what they check on the way, e.g. output equal to plain, holds)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON_TOOLS = ("bf16_mismatch", "linear_rollback", "loop_split", "static_compile_probe")


def _tool(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_tool_in_benchmarks_is_covered_here():
    tools = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("auto_")}
    assert tools == set(PYTHON_TOOLS)  # a new tool gets its --help and tiny run below (Auto's: test_auto_bench.py)


@pytest.mark.parametrize("name", PYTHON_TOOLS)
def test_python_tool_answers_help(name, capsys):
    module = _tool(name)
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage:") and module.__doc__.splitlines()[0][:40] in out


@pytest.mark.parametrize("script, listed, section", [("gpu_bench.sh", ("p0", "a1"), "p0"),
                                                    ("auto_bench.sh", ("world", "cpu4"), "tiny")])
def test_shell_bench_answers_help_and_refuses_an_unknown_section_before_running(tmp_path, script, listed, section):
    script = str(ROOT / "benchmarks" / script)
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and all(name in shown.stdout for name in listed)
    refused = subprocess.run(["bash", script, section, "nosuch"], capture_output=True, text=True, timeout=60,
                             env={"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2 and "nosuch" in refused.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_loop_split_on_tiny(capsys):
    _tool("loop_split").main(["--preset", "tiny", "--batch-sizes", "2", "--max-new-tokens", "8", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tiny,") and len(lines) == 3  # asserts inside: every output equal to plain
    assert "finished rows leave" in lines[1] and "all rows to the end" in lines[2]


def test_linear_rollback_on_tiny(capsys):
    pytest.importorskip("transformers.models.qwen3_5")
    _tool("linear_rollback").main(["--shape", "tiny", "--batch", "1", "--repeats", "2"])
    out = capsys.readouterr().out
    assert "batch 1: forward" in out and "A snapshot+replay" in out


def test_bf16_mismatch_on_a_tiny_fixture_float32_never_differs(tmp_path):
    out = tmp_path / "mismatch"
    assert _tool("bf16_mismatch").main(["--skip-world", "--dtypes", "float32", "--families", "llava", "--rows", "8",
                                        "--max-new-tokens", "6", "--out", str(out)]) == 0
    results = json.loads((out / "mismatch.json").read_text())["results"]["fixture:llava float32"]
    ours = {k: v for k, v in results["differing_rows"].items() if k.startswith("ours")}
    assert len(ours) == 4 and all(v["differ"] == 0 for v in ours.values())  # lossless in float32, batch 8 and 1
    assert sum(v["rows"] for v in ours.values()) == 4 * 8


def test_static_compile_probe_on_tiny(tmp_path):
    """With the compile backend 'eager': dynamo's graph and its replay over the static cache, without inductor's
    codegen (a minute on 2 loaded cores); the timed calls run under fail_on_recompile, so a recompile fails here."""
    out = tmp_path / "probe.json"
    _tool("static_compile_probe").main(["--preset", "tiny", "--batch", "1", "--widths", "2", "--warmup", "1",
                                        "--repeats", "2", "--backend", "eager", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["batch"] == 1 and row["width"] == 2 and row["graphs"] == 1 and row["compiled_ms"] > 0
