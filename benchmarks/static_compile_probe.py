"""Eager vs compiled target forwards over a static slotted cache, one process, one machine.

For the ``tiny`` bench preset's target (or another preset's), a prompt is prefilled eagerly into a
:class:`~hf_specmm.caches.StaticSlottedCache`; then the time of one forward of a 1-token decoding
step and of a (γ+1)-token verification block is measured, eager and through ``torch.compile`` as stock
``generate`` builds it (``CompileConfig``: inductor; ``mode="reduce-overhead"`` adds CUDA graphs on GPU).
Every timed forward is rolled back (write pointer and mask), so each one sees the same cache length. Medians
after warm-up, eager and compiled called in turn every repeat (on a shared machine, load hits both alike);
the first compiled call compiles (``compile_s``), every later one must replay that graph (``fail_on_recompile``).

    python benchmarks/static_compile_probe.py --preset tiny --batch 1 4 --widths 1 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig

from hf_specmm import _compat
from hf_specmm.bench.presets import build_preset, synthetic_inputs
from hf_specmm.bench.timing import sync
from hf_specmm.caches import StaticSlottedCache
from hf_specmm.targets import target_family


def interleaved(fns: dict[str, Any], device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds of each of ``fns``, called in turn every repeat (a shared machine's load hits all alike)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def step(forward: Any, kv: StaticSlottedCache, block: torch.Tensor) -> torch.Tensor:
    """One forward of ``block`` over ``kv``, then rolled back to where it started."""
    start = kv.length
    inputs = kv.append(None, block.shape[1])
    out = forward(input_ids=block, **kv.forward_kwargs(), use_cache=True, logits_to_keep=block.shape[1], **inputs)
    kv.rollback(start, block.new_zeros(block.shape[0], dtype=torch.long))
    return out.logits


def probe(preset_name: str, batches: list[int], widths: list[int], prompt_tokens: int, warmup: int, repeats: int,
          device: str, backend: str = "inductor") -> list[dict]:
    preset = build_preset(preset_name, device=device)
    target = preset.target
    # one graph per (batch, width)
    compiled = _compat.compiled_call(target, CompileConfig(dynamic=False, backend=backend))
    rows = []
    for batch in batches:
        inputs = synthetic_inputs(preset, batch, prompt_tokens)
        capacity = inputs["input_ids"].shape[1] + max(widths) + 1
        for width in widths:
            block = inputs["input_ids"][:, -width:].contiguous()
            result = {"preset": preset_name, "device": device, "batch": batch, "width": width,
                      "prompt_slots": inputs["input_ids"].shape[1], "capacity": capacity}
            with torch.inference_mode():
                positions = target_family(target).positions.bind(target, inputs["input_ids"],
                                                                  inputs["attention_mask"], dict(inputs))
                kv = StaticSlottedCache.from_prefill(target, inputs, capacity, positions)
                graphs = counters["stats"]["unique_graphs"]
                sync(kv.device)
                start = time.perf_counter()
                step(compiled, kv, block)  # compiles
                sync(kv.device)
                result["compile_s"] = time.perf_counter() - start
                with torch.compiler.set_stance("fail_on_recompile"):  # the timed calls replay that graph
                    calls = {"eager": lambda kv=kv, block=block: step(target, kv, block),
                             "compiled": lambda kv=kv, block=block: step(compiled, kv, block)}
                    times = interleaved(calls, kv.device, warmup, repeats)
                result["graphs"] = counters["stats"]["unique_graphs"] - graphs
            result["eager_ms"], result["compiled_ms"] = 1e3 * times["eager"], 1e3 * times["compiled"]
            result["speedup"] = result["eager_ms"] / result["compiled_ms"]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}), flush=True)
            rows.append(result)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 6], help="1: decoding step; γ+1: verification")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend (inductor: stock's; eager: dynamo's graphs without codegen)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = probe(args.preset, args.batch, args.widths, args.prompt_tokens, args.warmup, args.repeats, args.device,
                 args.backend)
    if args.out:
        import transformers

        meta = {"torch": torch.__version__, "transformers": transformers.__version__,
                "threads": torch.get_num_threads()}
        with open(args.out, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
