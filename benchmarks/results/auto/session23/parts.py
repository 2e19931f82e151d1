"""Batch 1, image adapter: per call, the time spent in Auto's own hooks and in resolve_plan, fixed chain g vs Auto(shapes=[g]) vs Auto, in turns."""
import sys, time, collections
import pathlib
import hf_specmm, hf_specmm.api as api
from hf_specmm.auto import budget as B, wrapper as W, calls as C
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "session22"))
from world_batch1 import world_batch1  # session 22's shared set-up
from timers import timed
name, g, cycles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
acc = collections.Counter()
timed(api, "resolve_plan", "resolve_plan", acc)
for m in ("for_round", "drafted", "observe", "update", "report"): timed(B.AutoBudget, m, m, acc)
timed(B.AutoBudget, "__init__", "budget_init", acc)
timed(W.Auto, "budget", "Auto.budget", acc)
timed(C.WholeCalls, "runs_plain", "runs_plain", acc)
world, target, x1, gen = world_batch1()
d = world.drafts[name]
methods = {"fixed": dict(assistant_model=d, num_assistant_tokens=g),
           "autog": dict(assistant_model=hf_specmm.Auto(d, max_tokens=64, shapes=[g])),
           "auto": dict(assistant_model=hf_specmm.Auto(d, max_tokens=64))}
for c in range(40):
    for m in methods.values(): target.generate(**x1[c % 32], **m, **gen)
tot = collections.defaultdict(float); parts = {k: collections.Counter() for k in methods}; rounds = collections.Counter()
for c in range(cycles):
    for i, x in enumerate(x1):
        names = list(methods); k0 = (c + i) % 3; names = names[k0:] + names[:k0]
        for k in names:
            acc.clear(); s = time.perf_counter(); target.generate(**x, **methods[k], **gen); tot[k] += time.perf_counter() - s
            parts[k].update(acc); rounds[k] += len(hf_specmm.last_stats(target).gammas or [])
n = cycles * 32
for k in methods:
    print(f"{k:6s} {1e3*tot[k]/n:6.2f} ms/call ({tot[k]/tot['fixed']:.3f}x fixed) rounds/call {rounds[k]/n:.2f} |",
          " ".join(f"{p} {1e3*v/n:.3f}" for p, v in sorted(parts[k].items())))
