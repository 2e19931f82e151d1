"""The sharp edges a new user hits first: CLI numbers refused by argparse in one line (exit code 2, no
traceback, before any model is built), every option's help showing its default, a demo whose table has no
speed figure that could contradict τ, the quickstart's claims matching what it prints, and
examples/train_world.py leaving the shipped checkpoints alone unless told otherwise."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hf_specmm import cli

ROOT = Path(__file__).resolve().parents[1]
TRAIN_REQUIRED = ["--target", "t", "--data", "d.jsonl", "--output-dir", "o", "--draft-config", "tiny"]


def _must_not_run(*args, **kwargs):
    raise AssertionError("argparse should have refused the arguments before any work")


@pytest.fixture
def no_work(monkeypatch):
    """Any model building or training fails the test: argument errors must come first."""
    import hf_specmm.bench.runner as runner
    import hf_specmm.train.run as train_run
    import hf_specmm.world.demo as demo
    import hf_specmm.world.tau_table as tau_table

    monkeypatch.setattr(runner, "run_benchmark", _must_not_run)
    monkeypatch.setattr(train_run, "train_draft", _must_not_run)
    monkeypatch.setattr(demo, "run_demo", _must_not_run)
    monkeypatch.setattr(tau_table, "tau_table", _must_not_run)


def _refused(argv: list[str], capsys) -> str:
    """Run the CLI, expect exit code 2; returns the single stderr line."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert captured.out == ""
    return err


BAD = [
    ("bench", ["--gammas", "0"], "--gammas"),
    ("bench", ["--gammas", "3", "0"], "--gammas"),  # every element of a list is checked
    ("bench", ["--gammas", "three"], "--gammas"),
    ("bench", ["--batch-sizes", "0"], "--batch-sizes"),
    ("bench", ["--repeats", "0"], "--repeats"),
    ("bench", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("bench", ["--acceptance", "1.5"], "--acceptance"),
    ("bench", ["--acceptance", "-0.1"], "--acceptance"),
    ("bench", ["--acceptance", "nan"], "--acceptance"),
    ("bench", ["--warmup", "-1"], "--warmup"),
    ("bench", ["--prompt-tokens", "0"], "--prompt-tokens"),
    ("demo", ["--per-task", "0"], "--per-task"),
    ("demo", ["--gamma", "0"], "--gamma"),
    ("world-tau", ["--gammas", "1", "0"], "--gammas"),
    ("world-tau", ["--per-task", "-2"], "--per-task"),
    *[("train", TRAIN_REQUIRED + extra, extra[0]) for extra in (
        ["--steps", "0"], ["--stage2-steps", "0"], ["--batch-size", "0"], ["--grad-accum", "0"], ["--lr", "0"],
        ["--lr", "-1e-3"], ["--stage2-lr", "0"], ["--stage2-lm-lr", "-1"], ["--eval-fraction", "1"],
        ["--eval-fraction", "-0.1"], ["--mm-share-start", "1.5"], ["--checkpoint-every", "-1"],
        ["--keep-checkpoints", "0"], ["--max-grad-norm", "0"], ["--top-p", "0"], ["--top-p", "1.1"],
        ["--temperature", "0"], ["--gamma", "0"], ["--max-new-tokens", "0"], ["--eval-max-new-tokens", "0"],
        ["--image-pool", "0"], ["--warmup-steps", "-1"], ["--weight-decay", "-1"], ["--stages", "3"],
        ["--stages", "2,1"], ["--stop-at-step", "0"], ["--gen-batch-size", "0"], ["--eval-batch-size", "0"])],
]


@pytest.mark.parametrize("command,args,option", BAD, ids=[f"{c}{' '.join(a[-2:])}" for c, a, _ in BAD])
def test_bad_numbers_are_one_line_usage_errors(command, args, option, capsys, no_work):
    err = _refused([command, *args], capsys)
    assert err.startswith(f"hf-specmm {command}: error: argument {option}"), err


def test_error_from_a_real_process_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "hf_specmm.cli", "bench", "--gammas", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "hf-specmm bench: error: argument --gammas: must be an integer >= 1, got 0 (see hf-specmm bench --help)"]


def test_bench_errors_after_parsing_are_one_line_too(tmp_path, capsys, no_work):
    err = _refused(["bench", "--preset", "tiny", "--acceptance", "0.5", "--do-sample"], capsys)
    assert "greedy" in err
    a_file = tmp_path / "out"
    a_file.write_text("")
    assert "is a file" in _refused(["bench", "--preset", "tiny", "--out", str(a_file)], capsys)


def test_bench_config_validates_for_library_users():
    from hf_specmm.bench import BenchConfig, run_benchmark

    with pytest.raises(ValueError, match=r"gammas=\[0\].*repeats=0.*acceptance=1.5"):
        run_benchmark(BenchConfig(preset="tiny", gammas=[0], repeats=0, acceptance=1.5), progress=False)


def test_values_argparse_accepts_at_the_bounds_pass_train_config_validate():
    """The CLI's bounds are TrainConfig.validate's: what argparse lets through, validate accepts."""
    from hf_specmm.train.cli import config_from_args

    args = cli.build_parser().parse_args(["train", *TRAIN_REQUIRED, "--eval-fraction", "0", "--mm-share-start", "1",
                                          "--stage2-lm-lr", "0", "--checkpoint-every", "0", "--steps", "1",
                                          "--stages", "1,2", "--warmup-steps", "0", "--lr", "1e-9"])
    config_from_args(args).validate()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_option_has_help_that_shows_its_default(command):
    sub = _subparsers(cli.build_parser())[command]
    formatter = sub._get_formatter()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        assert text.strip(), f"{command} {action.option_strings}: no help line"
        assert action.required or "default" in text, f"{command} {action.option_strings}: {text!r}"


def test_help_output_prints_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("(default: cpu-proxy)", "(default: [5])", "(default: 64)", "(default: 3)", "(default: 1)",
                  "(default: off, the draft's own proposals)"):
        assert shown in out, shown


def test_demo_prints_no_speed_figure_that_could_contradict_tau(tmp_path):
    from hf_specmm.world.demo import format_acceptance, run_demo

    lines: list[str] = []
    result = run_demo(tmp_path, per_task=1, plot=False, echo=lines.append)
    printed = "\n".join(lines)
    assert "×" not in printed and "speedup" not in printed.lower()
    # the only mention of speed points to the benchmark, which times interleaved repeats and takes medians
    assert all("hf-specmm bench" in line for line in printed.replace(str(tmp_path), "").splitlines()
               if "speed" in line.lower())
    for row in result["rows"]:
        assert "speedup" not in row and row["identical"]
        assert row["tau"] == pytest.approx(row["new_tokens"] / row["target_forwards"], abs=1e-3)
        acceptance = format_acceptance(row["acceptance"])  # "n/a" where nothing was drafted, never 0.00 or 1.00
        assert (row["acceptance"] is None) == (row["drafted"] == 0) and (acceptance == "n/a") == (row["drafted"] == 0)
        cell = f"{acceptance} ({row['accepted']} of {row['drafted']})"
        assert f"| {row['task']} | {row['draft']} | {row['tau']:.2f} | {cell} |" in printed


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_world_writes_to_a_work_folder_unless_told(monkeypatch, tmp_path, capsys):
    example = _load_example("train_world")
    from hf_specmm.world.shipped import CHECKPOINTS

    def ship(*argv: str) -> Path:
        return example.ship_dir_for(example.build_parser().parse_args(list(argv)))

    assert ship() == Path("world_work") / "checkpoints"
    assert ship("--work-dir", "w") == Path("w") / "checkpoints"
    assert ship("--ship-dir", "mine") == Path("mine")
    assert ship("--overwrite-shipped") == CHECKPOINTS
    assert ship("--ship-dir", str(CHECKPOINTS)) == CHECKPOINTS  # explicit: allowed
    with pytest.raises(SystemExit, match="--overwrite-shipped"):
        ship("--overwrite-shipped", "--ship-dir", "elsewhere")

    calls = []

    def fake_recipe(work_dir, ship_dir):
        calls.append((Path(work_dir), Path(ship_dir)))
        return {"target": {"heldout_accuracy": 1.0, "heldout_accuracy_shuffled_images": 0.0}, "drafts": {}}

    monkeypatch.setattr(example, "build_world_checkpoints", fake_recipe)
    monkeypatch.setattr(example.torch, "set_num_threads", lambda n: None)
    assert example.main(["--work-dir", str(tmp_path / "w")]) == 0
    assert calls == [(tmp_path / "w", tmp_path / "w" / "checkpoints")]
    assert CHECKPOINTS.resolve() not in calls[0][1].resolve().parents and calls[0][1].resolve() != CHECKPOINTS
    assert "hf-specmm demo --checkpoints" in capsys.readouterr().out


def test_quickstart_claims_match_what_it_prints(capsys):
    example = _load_example("offline_quickstart")
    example.main()
    out = capsys.readouterr().out
    text_only, with_image = out.split("prompts with an image")
    copy_line = "text-only copy of the target's LM: identical to plain generate: True"
    assert copy_line in text_only and "acceptance=1.00" in text_only.split(copy_line)[1].splitlines()[0]
    image_copy = with_image.split(copy_line)[1].splitlines()[0]
    assert "acceptance=1.00" not in image_copy  # a text-only draft cannot see the image
    adapter = with_image.split("image-adapter draft around that copy:")[1].splitlines()[0]
    assert "acceptance=1.00" in adapter and "identical to plain generate: True" in adapter
    assert "identical to plain generate: False" not in out
    assert "always right on text-only prompts" in " ".join(example.__doc__.split())


def test_unknown_flag_names_the_sub_command(capsys, no_work):
    err = _refused(["demo", "--repeats", "3"], capsys)
    assert err == "hf-specmm demo: error: unrecognized arguments: --repeats 3 (see hf-specmm demo --help)"


def test_train_plan_line_names_processes_batches_and_steps(monkeypatch):
    """What `hf-specmm train` prints before any forward (tests/test_more_families.py checks it against the
    steps a run took): 2 processes x batch 2 x 2 accumulated; a feature head's two default stages; the
    one-process `accelerate launch --cpu` trap."""
    from types import SimpleNamespace

    from hf_specmm.train import TrainConfig
    from hf_specmm.train.run import run_plan

    cfg = TrainConfig(target="t", data="d.jsonl", output_dir="o", draft_config="tiny", steps=150, batch_size=2,
                      grad_accum=2)
    two = SimpleNamespace(world=2, device="cpu")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert run_plan(cfg, two, "feature_head", (1, 2)) == (
        "hf-specmm train: 2 processes on cpu; batch 2 per process x 2 processes x 2 accumulated = 8 examples per "
        "optimizer step; feature_head draft: stage 1 (language) 150 steps + stage 2 (multimodal) 150 steps = 300 "
        "optimizer steps")
    one = SimpleNamespace(world=1, device="cpu")
    assert "note" not in run_plan(cfg, one, "text_only", (1,))
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what `accelerate launch --cpu` sets in its one process
    note = run_plan(cfg, one, "text_only", (1,)).splitlines()[1]
    assert "starts ONE process" in note and "torchrun --nproc_per_node N -m hf_specmm.cli train" in note
