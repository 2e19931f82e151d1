"""Per-step cost of each world draft next to a target step: parameters and the measured time of one draft
forward (one drafted token, on its own KV cache, as the loop runs it) over one target decoding step (one token
on the target's KV cache), batch 1, after a held-out prompt. A block drafter (DFlash) drafts a whole round in
that one forward: its row times the forward of a round (one new context slot and the whole block).
Machine-dependent (printed with the τ table as a ratio, which varies less than the times); τ is the
machine-independent number. Each draft's steps are timed in
turns with target steps and the fastest of each is kept: on a machine shared with other work, being preempted
only ever adds time, and more often to the longer (target) step, which skewed medians.

    >>> from hf_specmm.world.step_cost import step_costs
    >>> rows = step_costs(load_world_models(), eval_examples(1)["caption"][0])  # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .. import _compat
from ..budget import RoundBudget
from ..caches import DynamicBackend
from ..drafter import Prompt
from ..drafts import kind_of
from ..errors import IncompatibleDraftError
from ..selector import ArgmaxSelector
from ..targets import target_family, target_spec
from ..train.data import Example, encode_prompts
from ..vocab import VocabMap, draft_vocab_size


def _fastest_in_turns(fns: list[Any], repeats: int) -> list[float]:
    """Fastest seconds of each of ``fns``, called in turns (one call of each per repeat, after a warm-up call)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [min(spent) for spent in times]


@torch.no_grad()
def step_costs(world: Any, example: Example, repeats: int = 50) -> list[dict[str, Any]]:
    """One row per draft: parameters (and % of the target's), draft step / target step (fastest of
    ``repeats`` each, the target's timed in turns with that draft's)."""
    target, device = world.target, world.target.device
    _refuse_assistants(world.drafts, target)
    inputs = encode_prompts(world.processor, [example], "raw", device)
    ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
    out = target(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **inputs)
    cache, length, token = _compat.output_cache(out), ids.shape[1], out.logits[:, -1].argmax(-1)

    def target_step() -> None:
        target(input_ids=token[:, None], **_compat.cache_kwargs(cache), use_cache=True, logits_to_keep=1,
               attention_mask=torch.ones(1, length + 1, dtype=mask.dtype, device=device),
               position_ids=torch.full((1, 1), length, device=device))
        _compat.crop_cache(cache, length)

    n_target = sum(p.numel() for p in target.parameters())
    spec, family = target_spec(target), target_family(target)
    rows = []
    for name, draft in world.drafts.items():
        kind = kind_of(draft)
        # a kind scoring with the target's LM head proposes from the target's vocabulary (as checks.py reads it)
        size = draft_vocab_size(draft) if kind.target_vocab_size is None else kind.target_vocab_size(draft, target)
        drafter = kind.drafter(draft, VocabMap(spec, size, device))
        with drafter.watch(target):
            prefill = target(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **inputs)
        drafter.observe_prefill(prefill)
        drafter.prefill(Prompt(ids, mask, family.model_inputs(inputs)), token, DynamicBackend().new)

        one_slot = _one_context_slot(drafter) if kind.block_drafter else None

        def draft_step() -> None:  # reads the pending token, drafts one (the cache grows by a slot per call)
            if one_slot is not None and drafter.pending is None:  # a block drafter's next round: one accepted slot
                drafter.pending = one_slot
            drafter.propose(RoundBudget(1), ArgmaxSelector(), token)

        t_draft, t_target = _fastest_in_turns([draft_step, target_step], repeats)
        params = sum(p.numel() for p in draft.parameters())
        rows.append({"draft": name, "kind": kind.name, "parameters": params, "share_of_target": params / n_target,
                     "draft_step_ms": 1000 * t_draft, "target_step_ms": 1000 * t_target,
                     "cost_ratio": t_draft / t_target})
    return rows


def _refuse_assistants(drafts: dict[str, Any], target: Any) -> None:
    """Before any forward: a Gemma 4 assistant drafts from a Gemma 4 target's shared K/V and hidden state, which the
    loop hands it round by round; this one-step timing does not (and the world's target is not a Gemma 4)."""
    for name, draft in drafts.items():
        if kind_of(draft).name == "gemma4_assistant":
            raise IncompatibleDraftError(
                f"world draft {name!r} is a Gemma 4 assistant, which reads a Gemma 4 target's shared K/V and hidden "
                f"state; the world's target is {type(target).__name__} and step_costs does not time assistants: drop "
                "it from the world's drafts, and time it with `hf-specmm bench --preset tiny-gemma4 --draft-kind "
                "gemma4_assistant`")


def _one_context_slot(drafter: Any) -> tuple[torch.Tensor, ...]:
    """What a block drafter reads next after a round that accepted nothing: one context slot (the prompt's last
    position's true features, a real value) before its block."""
    features, valid, positions = drafter.pending  # the prompt's context, queued by prefill
    return features[:, -1:], valid[:, -1:], positions[:, -1:]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| draft | parameters (% of target) | draft step / target step |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['draft']} | {r['parameters']:,} ({100 * r['share_of_target']:.1f} %) | "
                     f"{r['cost_ratio']:.2f} ({r['draft_step_ms']:.2f} ms / {r['target_step_ms']:.2f} ms) |")
    return "\n".join(lines)
