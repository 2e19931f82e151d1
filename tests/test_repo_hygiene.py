"""The repository is a product, not a lab notebook: no tracked file (code, comments, docs, tests, results, file
names) speaks of how its work was organised (numbered work sessions, issue numbers) or of which machines were
available for it. What the software does and what was measured, with command and commit, is what stays."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".json", ".jsonl", ".cfg", ".yaml", ".yml", ".ini", ".csv", ""}

# Each pattern names a kind of work history. "Round" alone is the speculative round, "drawn" a sample: neither is
# matched; a round or run is only matched where it numbers the work (e.g. "a round of the work", "round N, session").
HISTORY = {
    "a work session": re.compile(r"\bsessions? ?#?\d+|\bsessions?[-_]?\d+"
                                 r"|\b(?:this|that|next|previous|earlier|later|last) session\b", re.I),
    "an issue number": re.compile(r"\bissues? ?#?\d+|(?<![\w/.-])#\d{1,5}\b", re.I),
    "a numbered round of the work": re.compile(r"\bround \d+ of the work\b|\bround \d+, session\b|\bafter round \d+\b"
                                               r"|\bround \d+ (?:work|review)\b", re.I),
    "which machines were available": re.compile(r"\b(?:was|were|been|not|never|is) lent\b|\blent (?:to|once|through)\b"
                                                r"|\bnot drawn for\b|\bdevice tool\b|\bno GPU (?:was|is) available\b",
                                                re.I),
}


def tracked_files() -> list[Path]:
    """The files git tracks (untracked scratch is not the product); outside a git checkout, every file below the
    repository root but caches and build outputs."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        paths = [ROOT / p for p in listed.stdout.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", "__pycache__", "build", "dist", ".pytest_cache"}
        paths = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in paths if p.is_file()]


def offences(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, pattern in HISTORY.items() for m in pattern.finditer(text)]


@pytest.mark.parametrize("text, found", [
    ("measured in session 12 (round 4, session 3)", 3), ("as this session found", 1),
    ("see issue #27 and issue 30", 2), ("fixes #58", 1),
    ("no GPU was lent to this task", 1), ("benchmarks/results/auto/session24/mix", 1),
    ("a speculative round drafts γ tokens; round 3 keeps 2; rows drawn at random", 0),
    ("vllm-project/vllm#33458; the pytest session fixture", 0),
])
def test_the_patterns_find_work_history_and_leave_the_technical_words(text, found):
    assert len(offences(text)) == found, offences(text)


def test_no_work_history_in_tracked_files():
    """Every tracked file's name, and the text of every text file (binary files, e.g. weights, are skipped)."""
    files = [p for p in tracked_files() if p != Path(__file__).resolve()]  # this file's examples must match
    assert len(files) > 100
    found = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        hits = [f"file name: {h}" for h in offences(rel)]
        if path.suffix in TEXT_SUFFIXES:
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                lines = []
            hits += [f"line {n}: {h}" for n, line in enumerate(lines, 1) for h in offences(line)]
        if hits:
            found[rel] = hits[:5]
    assert found == {}, "\n".join(f"{k}: {v}" for k, v in sorted(found.items()))
