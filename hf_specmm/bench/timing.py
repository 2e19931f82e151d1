"""Clocks that respect device asynchrony, and the cost-model step times T1, Tv, Td."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from .. import _compat
from ..devices import execution_device
from ..drafter import Prompt
from ..drafts.gemma4_assistant.modeling import is_gemma4_assistant
from ..drafts.registry import kind_of


def sync(device: torch.device) -> None:
    if device.type == "cuda":  # every GPU: a dispatched target (--device-map) runs on several
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def median_time(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[float, Any]:
    """Median wall time of ``fn`` after ``warmup`` calls (device synchronised before every clock read)."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


class PrefillClock:
    """When the first forward of ``model`` after :meth:`arm` ended (device synchronised then: once per call).
    A generate call's time after it is its decoding phase: what the per-row cost model describes."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.device, self.armed, self.end = device, False, None
        self.handle = model.register_forward_hook(self._post)

    def arm(self) -> None:
        self.armed, self.end = True, None

    def _post(self, *args: Any) -> None:
        if self.armed:
            sync(self.device)
            self.armed, self.end = False, time.perf_counter()

    def remove(self) -> None:
        self.handle.remove()


def interleaved_medians(fns: dict[str, Callable[[], Any]], device: torch.device, warmup: int, repeats: int,
                        clock: PrefillClock | None = None) -> dict[str, tuple[float, Any, list[float], list[float]]]:
    """Median time of each function, measured in turns (a, b, c, a, b, c, ...) so that load from
    other processes affects every method alike; returns ``{name: (median_s, last_result, all_times_s,
    decode_times_s)}``, the last: each call's time after its first forward of ``clock``'s model (empty without).
    A function with a ``prepare()`` method has it run before its clock starts: the harness's own set-up (a
    controlled draft's reference) is no part of the method's time."""
    results: dict[str, Any] = {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    decode: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(warmup):
        for name, fn in fns.items():
            results[name] = fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            prepare = getattr(fn, "prepare", None)
            if prepare is not None:
                prepare()
            sync(device)
            if clock is not None:
                clock.arm()
            start = time.perf_counter()
            results[name] = fn()
            sync(device)
            end = time.perf_counter()
            times[name].append(end - start)
            if clock is not None and clock.end is not None:
                decode[name].append(end - clock.end)
    return {name: (statistics.median(times[name]), results.get(name), times[name], decode[name]) for name in fns}


@torch.no_grad()
def _step_time(model: Any, cache: Any, length: int, mask: torch.Tensor | None, ids: torch.Tensor,
               device: torch.device, warmup: int, repeats: int, **extra: Any) -> float:
    """Time one forward of ``ids`` [B, k] on a cache of ``length`` slots (cropped back after each call);
    ``extra``: more forward kwargs (a feature head's ``features``)."""
    batch, width = ids.shape
    full_mask = None if mask is None else torch.cat([mask, mask.new_ones(batch, width)], 1)
    positions = (mask.sum(-1, keepdim=True) if mask is not None else torch.full((batch, 1), length, device=ids.device))
    positions = positions + torch.arange(width, device=ids.device)

    def step() -> None:
        model(input_ids=ids, attention_mask=full_mask, position_ids=positions, **_compat.cache_kwargs(cache),
              use_cache=True, logits_to_keep=width, **extra)
        _compat.crop_cache(cache, length)

    return median_time(step, device, warmup, repeats)[0]


@torch.no_grad()
def target_step_costs(target: Any, inputs: dict, gamma: int, warmup: int = 2, repeats: int = 5) -> dict[str, float]:
    """T1 (target, 1 token) and Tv (target, γ+1 tokens), after a real prefill; Tp: that prefill (one sample:
    it is the long one, and common to every method)."""
    device = execution_device(target)  # a dispatched target's first layer, not its (maybe offloaded) first weight
    cache = _compat.new_dynamic_cache(target)
    sync(device)
    start = time.perf_counter()
    target(**inputs, **_compat.cache_kwargs(cache), use_cache=True, logits_to_keep=1)
    sync(device)
    tp = time.perf_counter() - start
    length, mask = cache.get_seq_length(), inputs.get("attention_mask")
    batch = inputs["input_ids"].shape[0]
    token = torch.full((batch, 1), 5, dtype=torch.long, device=device)
    t1 = _step_time(target, cache, length, mask, token, device, warmup, repeats)
    tv = _step_time(target, cache, length, mask, token.expand(batch, gamma + 1).contiguous(), device, warmup, repeats)
    return {"T1": t1, "Tv": tv, "Tp": tp}


@torch.no_grad()
def draft_step_cost(draft: Any, target: Any, inputs: dict, vocab: Any, warmup: int = 2,
                    repeats: int = 5) -> dict[str, float]:
    """Td: one draft step (1 token per row, its logits included) after a prefill of the draft's prompt
    (Tpd: that prefill, one sample).
    A text-only LM reads the prompt's text tokens; a ``FeatureHeadDraft`` reads every prompt position (random
    features: the cost does not depend on their values) and its logits go through the target's LM head. A block
    drafter (DFlash): Td is its one forward per round (one new context slot and the whole block), Tpd the first
    (the prompt's context and the block)."""
    import inspect

    if kind_of(draft).block_drafter:
        return _block_step_cost(draft, target, inputs, vocab, warmup, repeats)
    if is_gemma4_assistant(draft):
        return _assistant_step_cost(draft, target, inputs, vocab, warmup, repeats)

    from ..drafts.text_only import text_only_view

    device = execution_device(draft)
    batch = inputs["input_ids"].shape[0]
    token = torch.full((batch, 1), 5, dtype=torch.long, device=device)
    cache = _compat.new_dynamic_cache(draft)
    if "features" in inspect.signature(draft.forward).parameters:  # a head on the target's features
        draft.attach(target, check=False)
        ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
        hidden = draft.config.text_config.hidden_size
        features = torch.randn(*ids.shape, hidden, device=device, dtype=draft.dtype)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        sync(device)
        start = time.perf_counter()
        draft(features=features, input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
              use_cache=True)
        extra = {"features": torch.randn(batch, 1, hidden, device=device, dtype=draft.dtype)}
    else:
        ids, valid = text_only_view(vocab, inputs["input_ids"], inputs["attention_mask"])
        ids, mask, extra = ids.to(device), valid.long().to(device), {}
        sync(device)
        start = time.perf_counter()
        draft(input_ids=ids, attention_mask=mask, **_compat.cache_kwargs(cache), use_cache=True, logits_to_keep=1)
    sync(device)
    tpd = time.perf_counter() - start
    td = _step_time(draft, cache, cache.get_seq_length(), mask, token, device, warmup, repeats, **extra)
    return {"Td": td, "Tpd": tpd}


def _block_step_cost(draft: Any, target: Any, inputs: dict, vocab: Any, warmup: int,
                     repeats: int) -> dict[str, float]:
    """Td / Tpd of a block drafter, run by its own drafter on random target features."""
    device = execution_device(draft)
    drafter = kind_of(draft).drafter(draft, vocab)
    drafter.target = target
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    width = len(draft.config.target_layer_ids) * draft.config.hidden_size
    drafter.prompt_features = torch.randn(*ids.shape, width, device=device, dtype=draft.dtype)
    anchor = torch.full_like(ids[:, 0], 5)
    drafter.prefill(Prompt(ids, mask), anchor, None)
    sync(device)
    start = time.perf_counter()
    drafter.block_logits(anchor)
    sync(device)
    tpd = time.perf_counter() - start
    batch = ids.shape[0]

    def step() -> None:  # one accepted token's features, then the block
        position = drafter.anchor_positions[:, None] - 1
        drafter.pending = (torch.randn(batch, 1, width, device=device, dtype=draft.dtype), position,
                           torch.ones(batch, 1, dtype=torch.bool, device=ids.device))
        drafter.block_logits(anchor)

    return {"Td": median_time(step, device, warmup, repeats)[0], "Tpd": tpd}


def _assistant_step_cost(draft: Any, target: Any, inputs: dict, vocab: Any, warmup: int,
                         repeats: int) -> dict[str, float]:
    """Td of a Gemma 4 assistant, run by its own drafter after a real target prefill: one step (the round's view of
    the target's shared K/V and one assistant forward). Tpd is 0: it has no cache and reads no prompt of its own."""
    from ..caches import DynamicBackend
    from ..selector import ArgmaxSelector
    from ..budget import RoundBudget
    from ..targets.positions import ROPE_1D

    drafter = kind_of(draft).drafter(draft, vocab)
    backend = DynamicBackend()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    kwargs = dict(inputs)
    backend.prepare_target(target, kwargs, None, ids.shape[1], 1)  # a sliding-window target keeps every slot
    with drafter.watch(target):
        out = target(**kwargs, use_cache=True, logits_to_keep=1)
    drafter.observe_prefill(out)
    device = execution_device(target)
    drafter.observe_target_cache(backend.wrap_target(target, _compat.output_cache(out), mask, ids.shape[1],
                                                     ids.shape[0], device, ROPE_1D))
    first = torch.full_like(ids[:, 0], 5)
    drafter.prefill(Prompt(ids, mask), first, backend.new)
    td = median_time(lambda: drafter.propose(RoundBudget(1), ArgmaxSelector(), first), device, warmup, repeats)[0]
    return {"Td": td, "Tpd": 0.0}


@torch.no_grad()
def step_costs(target: Any, draft: Any, inputs: dict, vocab: Any, gamma: int, warmup: int = 2,
               repeats: int = 5) -> dict[str, float]:
    """T1 (target, 1 token), Tv (target, γ+1 tokens), Td (draft, 1 token), after a real prefill of each (Tp, Tpd)."""
    return target_step_costs(target, inputs, gamma, warmup, repeats) | draft_step_cost(draft, target, inputs, vocab,
                                                                                      warmup, repeats)
