"""The static slotted cache computes what the dynamic one does, round after round of holes and rollbacks,
and a compiled forward over it is traced once: later rounds and later calls replay the same graph."""

from __future__ import annotations

import time

import pytest
import torch

from hf_specmm import _compat
from hf_specmm.cache_state import SlottedCache
from hf_specmm.caches_static import StaticSlottedCache, WindowMasks
from hf_specmm.targets import target_family
from conftest import batch_inputs, target

WIDTH = 4  # γ + 1 with γ = 3
# kept slots of the block per row and round (1 = only the first, i.e. no draft accepted): each row accepts
# everything in turn, so holes pile up in the others and the longest row changes from round to round
ACCEPTED = [[4, 1, 2], [1, 4, 1], [2, 2, 4], [1, 1, 1], [4, 3, 1], [1, 4, 2], [3, 1, 4], [4, 4, 4], [2, 1, 3], [1, 2, 1]]


def _prefill(model, inputs, cache):
    out = model(**inputs, **_compat.cache_kwargs(cache), use_cache=True)
    return out.logits[:, -1]


def _slotted_pair(model, inputs, capacity):
    """The same prompt prefilled into today's dynamic SlottedCache and into a StaticSlottedCache."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    batch, prompt = ids.shape
    sliding = _compat.has_sliding_layers(model.config)
    positions = target_family(model).positions.bind(model, ids, mask, dict(inputs))
    dynamic_cache = _compat.new_dynamic_cache()
    first_dynamic = _prefill(model, inputs, dynamic_cache)
    dynamic = SlottedCache(dynamic_cache, mask.long(), prompt, batch, ids.device, positions, compact=sliding)
    static_cache = _compat.new_static_cache(model, capacity, full_layers=sliding)
    first_static = _prefill(model, inputs, static_cache)
    windows = WindowMasks(model.config, model.dtype) if sliding else None
    static = StaticSlottedCache(static_cache, mask, prompt, batch, ids.device, positions, windows)
    torch.testing.assert_close(first_static, first_dynamic, atol=1e-5, rtol=0)
    return dynamic, static


def _round(model, kv, block, valid, forward=None):
    """One verification forward of ``block`` [B, WIDTH] over ``kv``; its logits [B, WIDTH, V]."""
    inputs = kv.block_inputs(valid, block.shape[1])
    forward = forward or model
    out = forward(input_ids=block, **_compat.cache_kwargs(kv.cache), use_cache=True, logits_to_keep=block.shape[1],
                  **inputs)
    kv.commit(inputs["attention_mask"], block.shape[1])
    return out.logits


def _kept(accepted):
    counts = torch.tensor(accepted)
    return torch.arange(WIDTH)[None] < counts[:, None]  # [B, WIDTH]: the accepted prefix of every row


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3"])
def test_static_equals_dynamic_with_holes(family):
    """Fixed-width blocks, per-row partial acceptance (holes), rollbacks, one block with invalid slots and a
    capacity small enough that holes must be compacted away: logits equal the dynamic cache's."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    prompt = inputs["input_ids"].shape[1]
    # without compaction the 10 rounds need prompt + 40 slots; the longest row holds prompt + 29 at most
    dynamic, static = _slotted_pair(model, inputs, capacity=prompt + 34)
    text_ids = inputs["input_ids"][:, -6:]  # ordinary text ids of this family's prompts
    gen = torch.Generator().manual_seed(0)
    compactions = 0
    for step, accepted in enumerate(ACCEPTED):
        block = text_ids.gather(1, torch.randint(0, 6, (3, WIDTH), generator=gen))
        # one round reads a block with unread (invalid) slots, as a drafter's pending tokens can be
        valid = torch.tensor([[True] * WIDTH, [False, True, True, True], [True] * WIDTH]) if step == 3 else None
        before = static.length
        logits_dynamic = _round(model, dynamic, block, valid)
        logits_static = _round(model, static, block, valid)
        compactions += static.length < before + WIDTH
        read = torch.ones(3, WIDTH, dtype=torch.bool) if valid is None else valid
        torch.testing.assert_close(logits_static[read], logits_dynamic[read], atol=1e-5, rtol=0,
                                   msg=lambda m: f"{family} round {step}: {m}")
        keep = _kept(accepted)
        if valid is not None:
            keep &= valid
        width = int(torch.tensor(accepted).max())
        dynamic.rollback(dynamic.length - WIDTH, keep[:, :width])
        static.rollback(static.length - WIDTH, keep[:, :width])
        assert torch.equal(static.mask.sum(-1), dynamic.mask.sum(-1))
    assert compactions >= 1, "the capacity was meant to force a compaction"
    assert static.capacity == prompt + 34 and static.mask.shape[1] == static.length <= static.capacity


def test_select_rows_and_bad_capacity():
    model = target("llava")
    inputs = batch_inputs("llava", 3)
    prompt = inputs["input_ids"].shape[1]
    dynamic, static = _slotted_pair(model, inputs, capacity=prompt + 8)
    block = inputs["input_ids"][:, -WIDTH:]
    for kv in (dynamic, static):
        _round(model, kv, block, None)
        kv.rollback(kv.length - WIDTH, _kept([2, 1, 3])[:, :3])
        kv.select_rows(torch.tensor([0, 2]))
    torch.testing.assert_close(_round(model, static, block[[0, 2]], None), _round(model, dynamic, block[[0, 2]], None),
                               atol=1e-5, rtol=0)
    assert static.cache.layers[0].keys.shape[0] == 2
    with pytest.raises(ValueError, match="max_cache_len"):  # 8 + 7 slots cannot hold another block of 4
        _round(model, static, block[[0, 2]], None)
    with pytest.raises(ValueError, match="max_cache_len"):
        StaticSlottedCache(_compat.new_static_cache(model, prompt - 1), None, prompt, 1, torch.device("cpu"))


def _static(model, inputs, capacity):
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    positions = target_family(model).positions.bind(model, ids, mask, dict(inputs))
    cache = _compat.new_static_cache(model, capacity)
    _prefill(model, inputs, cache)
    return StaticSlottedCache(cache, mask, ids.shape[1], ids.shape[0], ids.device, positions)


def test_compiled_forward_replays_one_graph():
    """``torch.compile`` (inductor, as stock's ``CompileConfig()`` builds it) over the static cache: after one
    warm-up round, further rounds with rollbacks and a second call with another prompt length compile
    nothing (``fail_on_recompile`` raises on any recompile, dynamo's graph counter does not move), and the
    compiled logits equal the eager ones."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = target("llava")
    torch._dynamo.reset()
    forward = _compat.compiled_call(model, CompileConfig())
    calls = [batch_inputs("llava", 3), batch_inputs("llava", 3, with_images=False)]
    lengths = [c["input_ids"].shape[1] for c in calls]
    assert lengths[0] != lengths[1]
    capacity = _compat.static_cache_length(model, max(lengths) + 4 * WIDTH)  # as stock sizes it, once per model
    graphs, compile_seconds = [], None
    for number, inputs in enumerate(calls):
        compiled_kv, eager_kv = _static(model, inputs, capacity), _static(model, inputs, capacity)
        block = inputs["input_ids"][:, -WIDTH:].contiguous()  # a view would change the stride guards per call
        for step, accepted in enumerate(ACCEPTED[:4]):
            if number == 0 and step == 0:  # warm-up: the one compilation
                start = time.perf_counter()
                compiled = _round(model, compiled_kv, block, None, forward)
                compile_seconds = time.perf_counter() - start
                graphs.append(counters["stats"]["unique_graphs"])
            else:
                with torch.compiler.set_stance("fail_on_recompile"):
                    compiled = _round(model, compiled_kv, block, None, forward)
            eager = _round(model, eager_kv, block, None)
            torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)
            for kv in (compiled_kv, eager_kv):
                kv.rollback(kv.length - WIDTH, _kept(accepted)[:, : max(accepted)])
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[-1] == graphs[0], f"graphs compiled after the warm-up round: {graphs}"
    print(f"warm-up round with compilation: {compile_seconds:.1f} s, {graphs[0]} graph(s)")
