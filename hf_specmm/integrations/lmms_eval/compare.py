"""Side by side: lmms-eval runs of the same tasks, plain and with drafts (each run's ``--output_path`` with
``--log_samples``). Per run: whether every per-sample output and every score equals the first (plain)
run's, the scores, lmms-eval's wall time, the time inside ``generate``, new tokens per second, and τ.

    python -m hf_specmm.integrations.lmms_eval.compare plain=out/plain text-only=out/text-only

Exit status 1 when an output or a score differs from the first run's (lossless decoding means none may).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...cli import ArgumentParser


@dataclass
class Run:
    label: str
    scores: dict[str, dict[str, float]]  # task -> metric -> value (stderr columns left out)
    outputs: dict[tuple[str, int], str]  # (task, doc_id) -> the model's answer
    wall_s: float  # lmms-eval's total_evaluation_time_seconds (loading, data, generation, scoring)
    throughput: dict[str, Any]  # results["throughput"]: lmms-eval's and hf_specmm's (hf_specmm_*) figures

    def stat(self, name: str) -> Any:
        return self.throughput.get(f"avg_hf_specmm_{name}")


def load_run(label: str, output_path: str | Path) -> Run:
    """The one lmms-eval run under ``output_path`` (its ``*_results.json`` and ``*_samples_<task>.jsonl``)."""
    if not Path(output_path).is_dir():
        raise ValueError(f"{label}={output_path}: no such folder (an lmms-eval --output_path)")
    found = sorted(Path(output_path).rglob("*_results.json"))
    if len(found) != 1:
        raise ValueError(f"{output_path}: expected one lmms-eval *_results.json (one run per --output_path), "
                         f"found {len(found)}")
    results_file = found[0]
    results = json.loads(results_file.read_text())
    stamp = results_file.name[: -len("_results.json")]
    scores = {task: {key.split(",")[0]: value for key, value in metrics.items()
                     if "," in key and "_stderr" not in key and isinstance(value, (int, float))}
              for task, metrics in results["results"].items()}
    outputs = {}
    for task in (t for t, s in scores.items() if s):
        samples = results_file.with_name(f"{stamp}_samples_{task}.jsonl")
        if not samples.is_file():
            raise ValueError(f"{samples} is missing: run lmms-eval with --log_samples")
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            answer = sample["filtered_resps"]
            outputs[task, sample["doc_id"]] = answer[0] if isinstance(answer, list) else answer
    return Run(label, {t: s for t, s in scores.items() if s}, outputs,
               float(results.get("total_evaluation_time_seconds", "nan")), results.get("throughput", {}))


def _number(value: Any, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def compare(runs: list[Run]) -> tuple[str, bool]:
    """A markdown table (the first run is the reference) and whether every run equals it."""
    base = runs[0]
    metrics = [(task, metric) for task, scores in base.scores.items() for metric in scores]
    header = ["run", "outputs = first run", "scores = first run",
              *(f"{task} {metric}" for task, metric in metrics),
              "lmms-eval wall s", "generate s", "new tokens / s", "generate speed vs first", "τ", "acceptance"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    all_equal = True
    for run in runs:
        same = sum(run.outputs.get(key) == answer for key, answer in base.outputs.items())
        outputs_equal = same == len(base.outputs) == len(run.outputs)
        scores_equal = run.scores == base.scores
        all_equal &= outputs_equal and scores_equal
        seconds, base_seconds = run.stat("generate_seconds"), base.stat("generate_seconds")
        speed = base_seconds / seconds if seconds and base_seconds else None
        cells = [run.label, f"{'yes' if outputs_equal else 'NO'} ({same} of {len(base.outputs)})",
                 "yes" if scores_equal else "NO",
                 *(_number(run.scores.get(task, {}).get(metric), 3) for task, metric in metrics),
                 _number(run.wall_s, 1), _number(seconds), _number(run.stat("tokens_per_s"), 1),
                 f"{speed:.2f}×" if speed else "n/a",
                 _number(run.stat("tau")) if run.stat("tau") is not None else "1 (plain)",
                 _number(run.stat("acceptance"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), all_equal


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m hf_specmm.integrations.lmms_eval.compare",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=OUTPUT_PATH", help="the first is the reference (plain)")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.runs):
        parser.error("each run is LABEL=OUTPUT_PATH, e.g. plain=out/plain")
    try:  # every run read (and refused, naming it) before anything is compared
        runs = [load_run(*item.split("=", 1)) for item in args.runs]
    except (ValueError, OSError, KeyError, TypeError, AttributeError) as err:  # a missing or malformed run
        parser.error(f"{type(err).__name__}: {err}" if isinstance(err, (KeyError, TypeError, AttributeError))
                     else str(err))
    table, equal = compare(runs)
    print(table)
    print("\nevery output and score equals the first run's" if equal else "\nOUTPUTS OR SCORES DIFFER")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
