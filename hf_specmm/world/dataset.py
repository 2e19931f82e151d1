"""Write a seeded miniature world to disk: PNG images, one JSONL per split and a ``manifest.json``.

JSONL lines are ``{"image": "images/<id>.png", "prompt": ..., "response": ..., "task": ...}`` (the
format ``hf-specmm train --data`` reads; the image path is relative to the JSONL file). Everything is
drawn from one ``random.Random(seed)``: the same seed gives byte-identical files.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> out = generate_world(Path(tempfile.mkdtemp()) / "world", n=6, seed=0)
    >>> sorted(p.name for p in out.iterdir())
    ['heldout.jsonl', 'images', 'manifest.json', 'train.jsonl']
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import AbstractSet, Iterator, Mapping

from .scenes import Scene, png_bytes, render, sample_scene
from .tasks import TASK_MAKERS, TASKS


DEFAULT_SPLITS: dict[str, float] = {"train": 0.8, "heldout": 0.2}


def _allocate(count: int, splits: Mapping[str, float]) -> dict[str, int]:
    """Split ``count`` items by proportion (largest remainder; ties broken by split name)."""
    names = sorted(splits)
    exact = {s: count * splits[s] for s in names}
    sizes = {s: int(exact[s]) for s in names}
    order = sorted(names, key=lambda s: (-(exact[s] - sizes[s]), s))
    for s in order[: count - sum(sizes.values())]:
        sizes[s] += 1
    return sizes


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def world_records(n: int, seed: int, splits: Mapping[str, float] | None = None, max_objects: int = 3,
                  exclude_scenes: AbstractSet[tuple] = frozenset()) -> Iterator[tuple[int, str, Scene, str, str, str]]:
    """``(index, split, scene, task, prompt, answer)`` for ``n`` examples, drawn only from ``random.Random(seed)``
    (tasks in turn: caption, vqa, reasoning; each task split by ``splits``, default train 0.8 / heldout 0.2).

    A scene whose ``tuple(scene.objects)`` is in ``exclude_scenes`` is drawn again (e.g. to keep evaluation
    scenes out of a training world). Nothing is rendered: listing 12 000 records takes a fraction of a second.
    """
    splits = dict(splits if splits is not None else DEFAULT_SPLITS)
    if n < 0 or not splits or any(p < 0 for p in splits.values()) or abs(sum(splits.values()) - 1) > 1e-9:
        raise ValueError(f"need n >= 0 and non-negative split proportions summing to 1, got n={n}, {splits}")
    if not 1 <= max_objects <= 9:
        raise ValueError(f"max_objects must be in 1..9, got {max_objects}")
    return _records(n, seed, splits, max_objects, exclude_scenes)


def _records(n: int, seed: int, splits: dict[str, float], max_objects: int,
             exclude_scenes: AbstractSet[tuple]) -> Iterator[tuple[int, str, Scene, str, str, str]]:
    rng = random.Random(seed)
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    split_of: list[str] = [""] * n
    for task in TASKS:
        ids = [i for i in range(n) if tasks[i] == task]
        rng.shuffle(ids)
        start = 0
        for name, size in _allocate(len(ids), splits).items():
            for i in ids[start:start + size]:
                split_of[i] = name
            start += size
    for i in range(n):
        scene = sample_scene(rng, max_objects)
        while tuple(scene.objects) in exclude_scenes:
            scene = sample_scene(rng, max_objects)
        prompt, answer = TASK_MAKERS[tasks[i]](scene, rng)
        yield i, split_of[i], scene, tasks[i], prompt, answer


def generate_world(out_dir: Path, n: int, seed: int,
                   splits: Mapping[str, float] | None = None,
                   image_size: int = 64, max_objects: int = 3,
                   exclude_scenes: AbstractSet[tuple] = frozenset()) -> Path:
    """Write the ``n`` examples of :func:`world_records` into ``out_dir``; return it.

    Every split mixes the tasks evenly. ``manifest.json`` records seed, counts and the sha256 of every other file.
    """
    splits = dict(splits if splits is not None else DEFAULT_SPLITS)
    records = world_records(n, seed, splits, max_objects, exclude_scenes)  # checks the arguments first
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = {name: [] for name in sorted(splits)}
    counts: dict[str, dict[str, int]] = {name: {t: 0 for t in TASKS} for name in sorted(splits)}
    width = max(6, len(str(n)))
    for i, split, scene, task, prompt, answer in records:
        rel = f"images/{i:0{width}d}.png"
        (out_dir / rel).write_bytes(png_bytes(render(scene, size=image_size)))
        record = {"image": rel, "prompt": prompt, "response": answer, "task": task}
        lines[split].append(json.dumps(record, sort_keys=True))
        counts[split][task] += 1
    for name in sorted(lines):
        (out_dir / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines[name]), encoding="utf-8")
    files = sorted([f"images/{i:0{width}d}.png" for i in range(n)] + [f"{name}.jsonl" for name in lines])
    manifest = {
        "seed": seed, "n": n, "image_size": image_size, "max_objects": max_objects,
        "splits": {name: splits[name] for name in sorted(splits)},
        "counts": counts, "files": {rel: _sha256(out_dir / rel) for rel in files},
    }
    if exclude_scenes:
        manifest["excluded_scenes"] = len(exclude_scenes)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    return out_dir
