"""The static slotted cache computes what one cache-free forward over each row's kept tokens does, round after
round of holes and rollbacks, and a compiled forward over it is traced once: later rounds and calls replay it."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from conftest import batch_inputs, target

from hf_specmm import _compat, testing
from hf_specmm.caches import StaticSlottedCache
from hf_specmm.targets import target_family

WIDTH = 4  # γ + 1 with γ = 3
# kept slots of the block per row and round (1 = only the first, i.e. no draft accepted): each row accepts
# everything in turn, so holes pile up in the others and the longest row changes from round to round
ACCEPTED = [[4, 1, 2], [1, 4, 1], [2, 2, 4], [1, 1, 1], [4, 3, 1],
            [1, 4, 2], [3, 1, 4], [4, 4, 4], [2, 1, 3], [1, 2, 1]]


def _static(model, inputs, capacity):
    """The prompt prefilled into a StaticSlottedCache of ``capacity`` slots, as the loop's target cache."""
    positions = target_family(model).positions.bind(model, inputs["input_ids"], inputs["attention_mask"], dict(inputs))
    return StaticSlottedCache.from_prefill(model, inputs, capacity, positions)


def _without_cache(model, inputs, rows):
    """Logits [B, L, V] of one cache-free forward over ``rows`` (each row's valid prompt tokens, then its own
    list of later ids), left-padded again as plain generate lays out a batch, images as in the prompt."""
    mask = inputs["attention_mask"].bool()
    batch, prompt = mask.shape
    width = max(int(mask[b].sum()) + len(rows[b]) for b in range(batch))
    out = {k: v for k, v in inputs.items() if not (torch.is_tensor(v) and v.shape[:2] == (batch, prompt))}
    for key, value in inputs.items():
        if key in out:
            continue
        laid = value.new_zeros(batch, width) + (value[~mask].flatten()[:1] if key == "input_ids" else 0)
        for b in range(batch):
            row = torch.cat([value[b][mask[b]], value.new_tensor(rows[b]) if key == "input_ids" else
                             value.new_zeros(len(rows[b]))])
            laid[b, width - len(row):] = row
        out[key] = laid
    out["attention_mask"] = (torch.arange(width)[None] >= width - torch.tensor(
        [int(mask[b].sum()) + len(rows[b]) for b in range(batch)])[:, None]).long()
    bound = target_family(model).positions.bind(model, out["input_ids"], out["attention_mask"], dict(out))
    out["position_ids"] = bound.prompt_positions(out["attention_mask"])
    return model(**out, use_cache=False).logits


def _round(model, kv, block, valid, forward=None):
    """One verification forward of ``block`` [B, WIDTH] over ``kv``; its logits [B, WIDTH, V]."""
    inputs = kv.append(valid, block.shape[1])
    forward = forward or model
    out = forward(input_ids=block, **_compat.cache_kwargs(kv.cache), use_cache=True, logits_to_keep=block.shape[1],
                  **inputs)
    return out.logits


def _kept(accepted):
    counts = torch.tensor(accepted)
    return torch.arange(WIDTH)[None] < counts[:, None]  # [B, WIDTH]: the accepted prefix of every row


@pytest.mark.parametrize("family, attention", [("llava", None), ("qwen2_5_vl", None), ("gemma3", None),
                                               ("gemma3", "eager")] + [(f, None) for f in testing.families_of("gemma4")])
def test_static_equals_cache_free_forward_with_holes(family, attention):
    """Fixed-width blocks, per-row partial acceptance (holes), rollbacks, one block with unread slots and a
    capacity small enough that holes must be compacted away: every read slot's logits equal those of one
    cache-free forward over that row's prompt and kept tokens (Gemma 3: its sliding window included, with
    the sdpa fixture's bool masks and eager attention's additive ones)."""
    model = target(family)
    if attention is not None:  # a copy: the shared fixture keeps its attention implementation
        model = copy.deepcopy(model)
        model.set_attn_implementation(attention)
        assert model.config.get_text_config()._attn_implementation == attention
    inputs = batch_inputs(family, 3)
    prompt = inputs["input_ids"].shape[1]
    # without compaction the 10 rounds need prompt + 40 slots; the longest row holds prompt + 29 at most
    static = _static(model, inputs, capacity=prompt + 34)
    # float32 sums in another order (a cache-free forward against one over cached keys): Gemma 4 differed by up to
    # 1.33e-5 on one machine's CPU and 3.44e-5 on another's; one kept token left out moves them by 1.5-4
    atol = 1e-4 if family.startswith("gemma4") else 3e-5
    text_ids = inputs["input_ids"][:, -6:]  # ordinary text ids of this family's prompts
    gen = torch.Generator().manual_seed(0)
    kept: list[list[int]] = [[] for _ in range(3)]
    compactions = 0
    for step, accepted in enumerate(ACCEPTED):
        block = text_ids.gather(1, torch.randint(0, 6, (3, WIDTH), generator=gen))
        # one round reads a block with unread (invalid) slots, as a drafter's pending tokens can be
        valid = torch.tensor([[True] * WIDTH, [False, True, True, True], [True] * WIDTH]) if step == 3 else None
        read = torch.ones(3, WIDTH, dtype=torch.bool) if valid is None else valid
        before = static.length
        logits = _round(model, static, block, valid)
        compactions += static.length < before + WIDTH
        reference = _without_cache(model, inputs, [kept[b] + block[b][read[b]].tolist() for b in range(3)])
        for b in range(3):
            torch.testing.assert_close(logits[b][read[b]], reference[b, -int(read[b].sum()):], atol=atol, rtol=0,
                                       msg=lambda m, step=step, b=b: f"{family} round {step} row {b}: {m}")
        keep = _kept(accepted) & read
        for b in range(3):
            kept[b] += block[b][keep[b]].tolist()
        static.rollback(static.length - WIDTH, torch.tensor(accepted))  # the accepted prefix, where it was read
        assert static.mask.sum(-1).tolist() == [int(m) + len(k) for m, k in zip(inputs["attention_mask"].sum(-1), kept)]
    assert compactions >= 1, "the capacity was meant to force a compaction"
    assert static.capacity == prompt + 34 and static.mask.shape[1] == static.length <= static.capacity


def test_select_rows_and_bad_capacity():
    """Rows leaving the batch keep their slots; a block that cannot fit even after compaction is refused."""
    model = target("llava")
    inputs = batch_inputs("llava", 3)
    prompt = inputs["input_ids"].shape[1]
    whole, selected = _static(model, inputs, prompt + 8), _static(model, inputs, prompt + 8)
    block = inputs["input_ids"][:, -WIDTH:].contiguous()
    for kv in (whole, selected):
        _round(model, kv, block, None)
        kv.rollback(kv.length - WIDTH, torch.tensor([2, 1, 3]))  # counts: the first 2 / 1 / 3 slots stay
    selected.select_rows(torch.tensor([0, 2]))
    assert selected.cache.layers[0].keys.shape[0] == 2 and selected.mask.shape == (2, prompt + 3)
    torch.testing.assert_close(_round(model, selected, block[[0, 2]], None), _round(model, whole, block, None)[[0, 2]],
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_cache_len"):  # 8 + 7 slots cannot hold another block of 4
        _round(model, selected, block[[0, 2]], None)
    with pytest.raises(ValueError, match="max_cache_len"):
        StaticSlottedCache(_compat.new_static_cache(model, prompt - 1), 1, torch.device("cpu"), length=prompt)


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
                kv.rollback(kv.length - WIDTH, torch.tensor(accepted))
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[-1] == graphs[0], f"graphs compiled after the warm-up round: {graphs}"
    print(f"warm-up round with compilation: {compile_seconds:.1f} s, {graphs[0]} graph(s)")


def test_compile_requested_as_stock_decides():
    """Stock's criteria, read under either cache keyword: a static cache and a compile_config allowed on every
    device compile; disable_compile, a dynamic cache or a CPU without that flag do not."""
    from transformers import CompileConfig, GenerationConfig

    model = target("llava")
    static = {"cache": _compat.new_static_cache(model, 8)}
    everywhere = CompileConfig()
    everywhere._compile_all_devices = True  # stock's own switch for compiling on CPU
    assert _compat.compile_requested(model, static, GenerationConfig(compile_config=everywhere))
    assert _compat.compile_requested(model, {"past_key_values": static["cache"]},
                                     GenerationConfig(compile_config=everywhere))
    off = GenerationConfig(compile_config=everywhere, disable_compile=True)
    assert not _compat.compile_requested(model, static, off)
    assert not _compat.compile_requested(model, {"cache": _compat.new_dynamic_cache()},
                                         GenerationConfig(compile_config=everywhere))
    assert not _compat.compile_requested(model, static, GenerationConfig())  # CPU, no flag
