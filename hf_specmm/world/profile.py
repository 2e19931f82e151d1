"""``hf-specmm world-tau --profile``: each shipped draft's acceptance profile on held-out world scenes — how often
the target's token is the draft's r-th choice at depth d of a round, given the path to it was accepted.

Measured with ``hf_specmm.Auto`` running one wide tree every round (``TreeShape(8, 8, 64)``: eight ranks tried at
every expanded node, eight levels): its acceptance table counts, per (depth, rank), the tries and the hits of
every node on the accepted paths (docs/auto.md). The profile is what ``hf-specmm bench --acceptance-profile``
replays under control (and what ``hf_specmm.Auto(prior=...)`` takes as a prior).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .. import api
from ..auto import Auto
from ..devices import execution_device
from ..train.data import Example, encode_prompts
from ..trees import TreeShape

PROFILE_SHAPE = TreeShape(top_k=8, depth=8, nodes=64)
PROFILE_RANKS = 8


def measure_profile(target: Any, processor: Any, draft: Any, examples: list[Example], max_new_tokens: int,
                    batch_size: int = 8) -> dict[str, Any]:
    """Greedy generation over ``examples`` with ``PROFILE_SHAPE`` trees; returns the profile
    (``profile[d][r]``, depth 1..8, rank 0..7), the rounds it was learned from and the trials per depth."""
    auto = Auto(draft, max_tokens=PROFILE_SHAPE.nodes, max_depth=PROFILE_SHAPE.depth, shapes=[PROFILE_SHAPE])
    was_enabled = api.is_enabled(target)
    api.enable(target)
    was_training = draft.training
    draft.eval()
    device = execution_device(target)
    try:
        for start in range(0, len(examples), batch_size):
            inputs = encode_prompts(processor, examples[start : start + batch_size], "raw", device)
            target.generate(**inputs, assistant_model=auto, max_new_tokens=max_new_tokens, do_sample=False)
    finally:
        draft.train(was_training)
        if not was_enabled:
            api.disable(target)
    table = auto.acceptance(target)
    return {"profile": table.as_profile(PROFILE_SHAPE.depth, PROFILE_RANKS), "rounds": table.rounds,
            "trials_by_depth": [int(sum(row) / table.unit) for row in table.trials[:PROFILE_SHAPE.depth]],
            "shape": f"{PROFILE_SHAPE.top_k},{PROFILE_SHAPE.depth},{PROFILE_SHAPE.nodes}", "prompts": len(examples)}


def write_profiles(world: Any, examples: dict[str, list[Example]], max_new_tokens: int, output: str) -> list[Path]:
    """One ``<output>_profile_<draft slug>.json`` per shipped draft, over every task's held-out scenes together."""
    every = [example for task in examples.values() for example in task]
    paths = []
    for name, draft in world.drafts.items():
        measured = measure_profile(world.target, world.processor, draft, every, max_new_tokens)
        path = Path(f"{output}_profile_{slug(name)}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"draft": name, **measured}, indent=1) + "\n")
        paths.append(path)
    return paths


def slug(name: str) -> str:
    """A draft's display name as a file name: ``text-only (distilled)`` -> ``text-only-distilled``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
