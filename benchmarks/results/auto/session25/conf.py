"""Batch 1 on the shipped world: which assistant_confidence_threshold a fixed chain runs with, and draft steps per
call of a fixed chain g against Auto(shapes=[g])."""
import sys, pathlib, collections
import hf_specmm, hf_specmm.checks as K
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "session22"))
from world_batch1 import world_batch1
name, g, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world, target, x1, gen = world_batch1()
d = world.drafts[name]
seen = []
orig = K.resolve_plan
def rp(*a, **k):
    p = orig(*a, **k); seen.append(p.budget.confidence); return p
K.resolve_plan = rp
import hf_specmm.api as api
if hasattr(api, "resolve_plan"): api.resolve_plan = rp
steps = collections.Counter()
mod = d.get_submodule(sys.argv[4]) if len(sys.argv) > 4 else d
mod.register_forward_pre_hook(lambda m, a: steps.update(["n"]))
methods = {"fixed": dict(assistant_model=d, num_assistant_tokens=g),
           "autog": dict(assistant_model=hf_specmm.Auto(d, max_tokens=64, shapes=[g]))}
print("draft generation_config threshold:", getattr(getattr(d, "generation_config", None), "assistant_confidence_threshold", None))
for k, m in methods.items():
    steps.clear(); seen.clear(); rounds = 0
    for c in range(calls):
        target.generate(**x1[c % 32], **m, **gen); rounds += len(hf_specmm.last_stats(target).gammas or [])
    print(k, "confidence", set(seen), "draft forwards/call", steps["n"] / calls, "rounds/call", rounds / calls)
