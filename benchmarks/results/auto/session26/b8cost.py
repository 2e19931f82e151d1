"""The shipped world at batch 8 (32 prompts, 4 calls of 8), one draft and chain γ: seconds per pass of a fixed chain
(the draft with num_assistant_tokens=γ), Auto(shapes=[γ]) (the same rounds with Auto's bookkeeping) and Auto
(cost-aware, after `warm` passes), in turns; then, with timers, Auto(shapes=[γ])'s bookkeeping per pass."""
import collections
import pathlib
import statistics as st
import sys
import time

import hf_specmm
from hf_specmm.auto import acceptance as A
from hf_specmm.auto import budget as B
from hf_specmm.auto import runs as R
from world32 import world_calls  # beside this script (its folder is sys.path[0])

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "session23"))
from timers import timed  # noqa: E402 - session 23's

name, gamma, warm, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
world, target, inputs, gen = world_calls(8)
draft = world.drafts[name]
auto, fixed_auto = hf_specmm.Auto(draft, max_tokens=64), hf_specmm.Auto(draft, shapes=[gamma])
methods = {"chain": dict(assistant_model=draft, num_assistant_tokens=gamma),
           "Auto(shapes=[g])": dict(assistant_model=fixed_auto), "Auto": dict(assistant_model=auto)}
for _ in range(warm):
    for x in inputs:
        target.generate(**x, **gen, assistant_model=auto)
times = {k: [] for k in methods}
shapes = collections.Counter()
for p in range(passes):
    order = list(methods)[p % 3:] + list(methods)[:p % 3]
    for k in order:
        s = time.perf_counter()
        for x in inputs:
            target.generate(**x, **gen, **methods[k])
            if k == "Auto":
                shapes.update(hf_specmm.last_stats(target).auto["shapes"])
        times[k].append(time.perf_counter() - s)
base = times["chain"]
for k in methods:
    paired = st.median(a / b for a, b in zip(times[k], base))
    print(f"{k:18s} {st.median(times[k]):.4f} s/pass, paired / chain {paired:.3f}")
print("Auto's shapes:", shapes.most_common(6))

acc: collections.Counter = collections.Counter()


for owner, attrs in ((B.AutoBudget, ("report", "_close", "for_round", "observe", "drafted", "update", "__init__")),
                     (A.AcceptanceTable, ("as_profile", "observe_chain", "observe_ends")),
                     (R.AnswerRecorder, ("record",)), (R.AnswerBook, ("add_call",))):
    for a in attrs:
        if hasattr(owner, a):
            timed(owner, a, f"{owner.__name__}.{a}", acc)
for k in ("Auto(shapes=[g])", "Auto"):
    acc.clear()
    for _ in range(passes):
        for x in inputs:
            target.generate(**x, **gen, **methods[k])
    print(k, "bookkeeping, ms per pass:",
          ", ".join(f"{n} {1e3 * v / passes:.3f}" for n, v in acc.most_common()))
