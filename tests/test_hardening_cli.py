"""Every sub-command given bad values: refused before any model is loaded, in one line naming the option, exit code 2,
no traceback (each run as ``python -m hf_specmm.cli``, all at once). Output paths are created and checked writable
while parsing; a file that is not the answer cache is refused, not appended to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hf_specmm import testing

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "hf_specmm.cli"]
COMPARE = [sys.executable, "-m", "hf_specmm.integrations.lmms_eval.compare"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    target = root / "target"
    testing.tiny_target("llava").save_pretrained(target)
    testing.tiny_processor("llava").save_pretrained(target)
    (root / "data.jsonl").write_text(json.dumps({"image": None, "prompt": "hi"}) + "\n")
    (root / "a-file").write_text("")
    (root / "a-folder").mkdir()
    (root / "empty").mkdir()
    (root / "not-a-cache.jsonl").write_text("my notes\n")
    return root


def _train(*extra: str) -> list[str]:
    return [*CLI, "train", "--target", "target", "--data", "data.jsonl", "--output-dir", "out", "--draft-config", "tiny",
            "--steps", "1", "--no-progress", *extra]


# (name, argv, what the one line must name)
CASES = [
    ("train --device", _train("--device", "foo"), "--device"),
    ("train --target", [*CLI, "train", "--target", "./missing", "--data", "data.jsonl", "--output-dir", "out"], "--target"),
    ("train --output-dir file", _train("--output-dir", "a-file"), "--output-dir"),
    ("train --output-dir unwritable", _train("--output-dir", "/proc/hf-specmm-test"), "--output-dir"),
    ("train --draft-config negative", _train("--draft-config", '{"num_hidden_layers": 1, "hidden_size": -1, '
                                                               '"num_attention_heads": 1}'), "hidden_size=-1"),
    ("train --draft-config heads", _train("--draft-config", '{"num_hidden_layers": 1, "hidden_size": 3, '
                                                            '"num_attention_heads": 16}'), "num_attention_heads=16"),
    ("train --response-cache folder", _train("--response-cache", "a-folder"), "--response-cache"),
    ("train --response-cache corrupt", _train("--response-cache", "not-a-cache.jsonl"), "--response-cache"),
    ("train --push-to-hub", _train("--push-to-hub", "../../etc"), "--push-to-hub"),
    ("bench gemma4_assistant on tiny", [*CLI, "bench", "--preset", "tiny", "--draft-kind", "gemma4_assistant", "--out",
                                        "bench"], "gemma4_assistant"),
    ("bench --out file", [*CLI, "bench", "--preset", "tiny", "--out", "a-file"], "--out"),
    ("bench --out unwritable", [*CLI, "bench", "--preset", "tiny", "--out", "/proc/hf-specmm-test"], "--out"),
    ("demo --checkpoints", [*CLI, "demo", "--checkpoints", "empty"], "--checkpoints"),
    ("demo --output-dir", [*CLI, "demo", "--output-dir", "a-file"], "--output-dir"),
    ("world-tau --update-readme missing", [*CLI, "world-tau", "--update-readme", "missing.md"], "--update-readme"),
    ("world-tau --update-readme markers", [*CLI, "world-tau", "--update-readme", "a-file"], "--update-readme"),
    ("world-tau --output", [*CLI, "world-tau", "--output", "/proc/hf-specmm-test/tau"], "--output"),
    ("world-tau --checkpoints", [*CLI, "world-tau", "--checkpoints", "empty"], "--checkpoints"),
    ("world-task file", [*CLI, "world-task", "a-file"], "out_dir"),
    ("world-task unwritable", [*CLI, "world-task", "/proc/hf-specmm-test"], "out_dir"),
    ("compare missing", [*COMPARE, "plain=missing", "fast=missing-too"], "plain=missing"),
]


def test_bad_values_are_one_line_exit_2_without_traceback(work):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONWARNINGS": "ignore"}

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=6) as pool:  # each process only imports and parses: a few seconds of CPU
        done = list(pool.map(run, [argv for _, argv, _ in CASES]))
    failures = []
    for (name, _, needle), process in zip(CASES, done):
        lines = [line for line in process.stderr.splitlines() if line.strip()]
        if process.returncode != 2 or "Traceback" in process.stderr or len(lines) != 1 or needle not in lines[0]:
            failures.append(f"{name}: exit {process.returncode}, stderr {process.stderr[-600:]!r}")
    assert not failures, "\n".join(failures)
    assert not (work / "out").exists() and not (work / "bench").exists(), "a refused run left a folder behind"
    assert (work / "not-a-cache.jsonl").read_text() == "my notes\n"


def test_output_paths_are_checked_while_parsing_and_made_by_the_run(tmp_path, monkeypatch):
    """A folder that does not exist yet passes when its nearest existing ancestor takes a new file; parsing makes
    nothing (a parse refused on a later option leaves nothing behind); the run makes it before any work."""
    import argparse

    from hf_specmm import cli

    args = cli.build_parser().parse_args(["world-task", str(tmp_path / "a" / "b")])
    assert args.out_dir == str(tmp_path / "a" / "b") and not (tmp_path / "a").exists()
    args = cli.build_parser().parse_args(["world-tau", "--output", str(tmp_path / "c" / "tau")])
    assert not (tmp_path / "c").exists()
    (tmp_path / "f").write_text("")
    for bad in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a folder"):
            cli.output_folder(str(bad))
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write into folder"):
        cli.check_writable(Path("/proc/hf-specmm-test"), "folder", create=True)
    cli.check_writable(tmp_path / "d" / "e", "folder", create=True)
    assert (tmp_path / "d" / "e").is_dir() and not any((tmp_path / "d" / "e").iterdir())


def test_the_answer_cache_takes_its_own_lines_and_skips_a_cut_last_one(tmp_path):
    from hf_specmm.train import TrainingInputError
    from hf_specmm.train.responses import read_response_cache

    good = json.dumps({"key": "k1", "response_ids": [1, 2], "text": "a b"})
    cache = tmp_path / "cache.jsonl"
    cache.write_text(good + "\n" + good[:15] + "\n")  # the last line cut by an interrupted write
    assert read_response_cache(cache) == {"k1": [1, 2]}
    for text in (good[:15] + "\n" + good + "\n", '{"key": 1, "response_ids": []}\n', '[1, 2]\n',
                 json.dumps({"key": "k", "response_ids": ["a"]}) + "\n"):
        cache.write_text(text)
        with pytest.raises(TrainingInputError, match=r"cache\.jsonl, line 1: not a line of hf-specmm train's"):
            read_response_cache(cache)


class _WorkBegan(Exception):
    """Raised by a patched work function once it has seen what the run made before it."""


def test_every_output_folder_exists_before_the_work_starts(work, tmp_path, monkeypatch):
    """Each sub-command that writes results makes their folder (missing, several levels deep) when the run starts,
    before the first measurement or model load: what the work would write at its end cannot fail for want of it."""
    from hf_specmm import cli
    from hf_specmm.bench import runner
    from hf_specmm.train import run as train_run
    from hf_specmm.world import demo, lmms_task, tau_table

    seen: dict[str, list[bool]] = {}

    def began(name: str, *folders: Path):
        def work_function(*args, **kwargs):
            seen[name] = [folder.is_dir() for folder in folders]
            raise _WorkBegan(name)
        return work_function

    out = tmp_path / "out"
    cases = {
        "bench": (runner, "run_benchmark", [out / "bench" / "a", out / "profile" / "b"],
                  ["bench", "--preset", "tiny", "--out", str(out / "bench" / "a"),
                   "--write-profile", str(out / "profile" / "b" / "p.json")]),
        "world-tau": (tau_table, "tau_table", [out / "tau" / "a"], ["world-tau", "--output", str(out / "tau" / "a" / "t")]),
        "demo": (demo, "load_world_models", [out / "demo" / "a"], ["demo", "--no-plot", "--output-dir",
                                                                  str(out / "demo" / "a")]),
        "world-task": (lmms_task, "eval_examples", [out / "task" / "a"], ["world-task", str(out / "task" / "a")]),
        "train": (train_run, "load_target", [out / "train" / "a", out / "cache" / "b"],
                  ["train", "--target", str(work / "target"), "--data", str(work / "data.jsonl"), "--output-dir",
                   str(out / "train" / "a"), "--response-cache", str(out / "cache" / "b" / "answers.jsonl"),
                   "--draft-config", "tiny", "--steps", "1", "--no-progress"]),
    }
    for name, (module, function, folders, argv) in cases.items():
        monkeypatch.setattr(module, function, began(name, *folders))
        assert not any(folder.exists() for folder in folders)
        with pytest.raises(_WorkBegan, match=name):
            cli.main(argv)
        assert seen[name] == [True] * len(folders), (name, seen[name])
