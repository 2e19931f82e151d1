"""``hf-specmm world-task DIR``: the miniature world as an lmms-eval task folder, run offline with
``lmms-eval --include_path DIR --tasks hf_specmm_world ...``.

The folder holds one YAML per task, a group YAML and one local JSONL dataset per task (each line a
held-out scene: its PNG inline as base64, the question, the reference answer), so it can be moved or
copied as a whole; lmms-eval resolves ``data_files`` against the YAML's folder. The task functions below
(``doc_to_visual``, ``doc_to_text``, ``*_results``) are referenced from the YAMLs by module path.

    hf_specmm_world_caption  describe the scene       exact_match, bleu (sacrebleu corpus BLEU, 0-100)
    hf_specmm_world_vqa      one-word answers          exact_match
    hf_specmm_world          both (group)

The scenes are those of ``hf-specmm demo`` (evaluation seed, no training scene), so the same ``--per-task``
always writes the same files.

Example::

    >>> folder = write_world_task(tmp_dir, per_task=4)  # doctest: +SKIP
    >>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
    ['caption.jsonl', 'hf_specmm_world.yaml', 'hf_specmm_world_caption.yaml', 'hf_specmm_world_vqa.yaml', 'vqa.jsonl']
"""

from __future__ import annotations

import base64
import io
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from .shipped import CHECKPOINTS, eval_examples
from .target import MAX_ANSWER_TOKENS

if TYPE_CHECKING:  # argparse is used only when the dispatcher builds the parser
    import argparse

GROUP = "hf_specmm_world"
TASK_NAMES = {"caption": f"{GROUP}_caption", "vqa": f"{GROUP}_vqa"}
_FUNCTIONS = __name__  # the YAMLs' `!function` module path (lmms-eval imports it by name)
_METRICS = {
    "caption": (("exact_match", "mean"), ("bleu", "bleu")),
    "vqa": (("exact_match", "mean"),),
}


def doc_to_visual(doc: dict[str, Any]) -> list[Image.Image]:
    """The scene's image (decoded from the line's base64 PNG)."""
    return [Image.open(io.BytesIO(base64.b64decode(doc["image_png"]))).convert("RGB")]


def doc_to_text(doc: dict[str, Any], lmms_eval_specific_kwargs: dict | None = None) -> str:
    """The question as the world target was trained on it (the chat template puts the image first)."""
    return doc["question"]


def _answer(results: list) -> str:
    return str(results[0]).strip()


def caption_results(doc: dict[str, Any], results: list) -> dict[str, Any]:
    """Exact match per scene, and (reference, prediction) pairs for lmms-eval's corpus ``bleu``."""
    answer = _answer(results)
    return {"exact_match": float(answer == doc["answer"]), "bleu": (doc["answer"], answer)}


def vqa_results(doc: dict[str, Any], results: list) -> dict[str, Any]:
    return {"exact_match": float(_answer(results) == doc["answer"])}


def _task_yaml(task: str) -> str:
    metrics = "".join(f"  - metric: {name}\n    aggregation: {aggregation}\n    higher_is_better: true\n"
                      for name, aggregation in _METRICS[task])
    return (f"# Written by `hf-specmm world-task`: held-out miniature-world scenes, {task}.\n"
            f"task: {TASK_NAMES[task]}\n"
            "dataset_path: json\n"
            f"dataset_kwargs:\n  data_files:\n    test: {task}.jsonl\n"
            "test_split: test\n"
            "output_type: generate_until\n"
            f"doc_to_visual: !function {_FUNCTIONS}.doc_to_visual\n"
            f"doc_to_text: !function {_FUNCTIONS}.doc_to_text\n"
            "doc_to_target: answer\n"
            f"process_results: !function {_FUNCTIONS}.{task}_results\n"
            f"generation_kwargs:\n  max_new_tokens: {MAX_ANSWER_TOKENS}\n  temperature: 0\n  do_sample: false\n"
            f"metric_list:\n{metrics}"
            "metadata:\n  version: 1.0\n")


def write_world_task(out_dir: str | Path, per_task: int = 32) -> Path:
    """Write the task folder (see the module docstring) into ``out_dir``; returns it.

    ``per_task`` held-out scenes per task (captioning and VQA), the evaluation scenes of ``hf-specmm demo``.
    """
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hf_specmm_world_task_") as work:
        examples = eval_examples(per_task, work)
        for task in TASK_NAMES:
            lines = [json.dumps({"id": i, "question": e.prompt, "answer": e.response,
                                 "image_png": base64.b64encode(Path(e.image).read_bytes()).decode("ascii")})
                     for i, e in enumerate(examples[task])]
            (out / f"{task}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            (out / f"{TASK_NAMES[task]}.yaml").write_text(_task_yaml(task), encoding="utf-8")
    group = "".join(f"  - {name}\n" for name in TASK_NAMES.values())
    (out / f"{GROUP}.yaml").write_text(f"group: {GROUP}\ntask:\n{group}", encoding="utf-8")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``world-task`` flags on ``parser`` (called by ``hf_specmm.cli``)."""
    from ..cli import int_at_least, output_folder

    parser.add_argument("out_dir", type=output_folder,
                        help="folder to write the task into (created if missing; checked writable before any work)")
    parser.add_argument("--per-task", type=int_at_least(1), default=32, help="held-out scenes per task")


def run(args: argparse.Namespace) -> int:
    out = write_world_task(args.out_dir, per_task=args.per_task)
    print(f"wrote lmms-eval tasks {', '.join(TASK_NAMES.values())} (group {GROUP}) to {out}\n"
          f"run: lmms-eval --include_path {out} --tasks {GROUP} --model hf_specmm --model_args "
          f"pretrained={CHECKPOINTS / 'world-target'},draft={CHECKPOINTS / 'text-only-draft'},batch_size=8")
    return 0
