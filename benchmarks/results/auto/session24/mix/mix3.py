"""The shipped world at batch 1, one draft under Auto, every prompt run as plain generate and speculative (forced, in
alternating order), 4 passes after 64 warm-up calls: per call its kind, wall time and what it put into the cost table
(add_call / add_stock_call arguments), as JSON lines for offline estimators. argv: draft out.jsonl"""
import sys, time, json
import torch, hf_specmm
from hf_specmm.auto.budget import AutoBudget
from hf_specmm.auto.costs import CostTable
from world_batch1 import world_batch1
torch.set_num_threads(2)
name, out = sys.argv[1], sys.argv[2]
world, target, x1, gen = world_batch1()
auto = hf_specmm.Auto(world.drafts[name], max_tokens=64)
for c in range(64):
    target.generate(**x1[c % 32], **gen, assistant_model=auto)
force = [None]
real = AutoBudget.runs_plain
AutoBudget.runs_plain = lambda self: (real(self), force[0])[1]
logged = []
add_call, add_stock = CostTable.add_call, CostTable.add_stock_call
CostTable.add_call = lambda self, *a: (logged.append(("spec", a)), add_call(self, *a))[1]
CostTable.add_stock_call = lambda self, *a: (logged.append(("plain", a)), add_stock(self, *a))[1]
with open(out, "w") as f:
    for p in range(4):
        for i in range(32):
            for kind in (("plain", "spec") if (i + p) % 2 else ("spec", "plain")):
                force[0] = kind == "plain"; logged.clear()
                s = time.perf_counter(); target.generate(**x1[i], **gen, assistant_model=auto); t = time.perf_counter() - s
                f.write(json.dumps({"pass": p, "prompt": i, "kind": kind, "wall": t,
                                    "logged": [[k, list(a)] for k, a in logged]}) + "\n")
