"""Held-out τ (block efficiency) and acceptance measured with hf_specmm's own generate path: the numbers
a user gets from ``hf_specmm.enable(target); target.generate(..., assistant_model=draft)``.

    >>> measure_tau(target, processor, draft, heldout, gamma=5, max_new_tokens=32)  # doctest: +SKIP
    {'gamma': 5, 'block_efficiency': 2.41, 'acceptance_rate': 0.43, 'prompts': 64, ...}
"""

from __future__ import annotations

from typing import Any

import torch

from .. import api
from ..devices import execution_device
from .data import Example, encode_prompts
from .distributed import Processes


@torch.no_grad()
def measure_tau(target: Any, processor: Any, draft: Any, examples: list[Example], gamma: int, max_new_tokens: int,
                batch_size: int = 8, prompt_format: str = "auto", procs: Processes | None = None) -> dict[str, Any]:
    """Greedy speculative generation over ``examples`` (batched, left-padded); counts summed over all rows.
    With several processes each runs every ``world``-th batch (the same batches as one process would) and
    the counts are summed over processes, so every process returns the numbers of the whole held-out set.

    ``block_efficiency`` τ = generated tokens / target forwards (prefill included, as
    ``hf_specmm.last_stats``); ``acceptance_rate`` = accepted / drafted tokens.
    """
    was_enabled = api.is_enabled(target)
    api.enable(target)
    was_training = draft.training
    draft.eval()
    totals = dict(generated_tokens=0, target_forwards=0, drafted_tokens=0, accepted_tokens=0)
    device = execution_device(target)  # a dispatched target (device_map=...) may hold offloaded weights on meta
    try:
        batches = range(0, len(examples), batch_size)
        for start in batches[procs.rank :: procs.world] if procs is not None else batches:
            inputs = encode_prompts(processor, examples[start : start + batch_size], prompt_format, device)
            target.generate(**inputs, assistant_model=draft, num_assistant_tokens=gamma,
                            num_assistant_tokens_schedule="constant", max_new_tokens=max_new_tokens, do_sample=False)
            stats = api.last_stats(target)
            for key in totals:
                totals[key] += getattr(stats, key)
    finally:
        draft.train(was_training)
        if not was_enabled:
            api.disable(target)
    if procs is not None:
        totals = {k: int(v) for k, v in procs.sum(totals).items()}
    tau = totals["generated_tokens"] / totals["target_forwards"] if totals["target_forwards"] else 0.0
    acc = totals["accepted_tokens"] / totals["drafted_tokens"] if totals["drafted_tokens"] else 0.0
    return {"gamma": gamma, "block_efficiency": round(tau, 4), "acceptance_rate": round(acc, 4),
            "prompts": len(examples), **totals}


def card_results(measured: dict[str, Any]) -> dict[str, Any]:
    """The three numbers ``hf_specmm.annotate_draft(results=...)`` puts into the model card."""
    return {k: measured[k] for k in ("gamma", "block_efficiency", "acceptance_rate")}
