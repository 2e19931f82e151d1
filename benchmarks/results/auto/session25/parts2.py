"""Batch 1 on the shipped world, Auto(shapes=[g]) alone: the seconds per call of the pieces of Auto's report and
round bookkeeping (timers.py wrappers), to see which are worth making cheaper."""
import sys, pathlib, collections, time
import hf_specmm
from hf_specmm.auto import budget as B, acceptance as A, runs as R, calls as C, costs as CO
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "session22"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "session23"))
from world_batch1 import world_batch1
from timers import timed
name, g, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
acc = collections.Counter()
for owner, attrs in ((B.AutoBudget, ("report", "_close", "for_round", "observe", "drafted", "update", "__init__")),
                     (A.AcceptanceTable, ("as_profile", "probabilities", "observe_chain")),
                     (R.AnswerBook, ("add_call",)), (C.WholeCalls, ("_time_call", "runs_plain")),
                     (CO.CostTable, ("add_call",))):
    for a in attrs:
        if hasattr(owner, a): timed(owner, a, f"{owner.__name__}.{a}", acc)
world, target, x1, gen = world_batch1()
d = world.drafts[name]
shapes = None if g == 0 else [g]
auto = hf_specmm.Auto(d, max_tokens=64, shapes=shapes)
for c in range(64): target.generate(**x1[c % 32], assistant_model=auto, **gen)
acc.clear(); s = time.perf_counter()
for c in range(calls): target.generate(**x1[c % 32], assistant_model=auto, **gen)
print(f"{1e3 * (time.perf_counter() - s) / calls:.2f} ms/call")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"{1e3 * v / calls:7.3f} ms/call {k}")
