"""World batch 1: what an Auto call run as plain generate spends beside plain generate's own call. After 72 warm-up
Auto calls, per prompt (128 calls, the 32 prompts in turn) plain generate and Auto in alternating order; over the
pairs where Auto's call ran as plain generate: each side's whole call, its stock generate inside, and Auto's checks
(resolve_plan), whole-call choice (runs_plain) and report. argv: draft [force] (force: every Auto call runs as
plain generate, its choice still made and timed, as where plain generate wins)"""
import sys, time, collections
import hf_specmm, hf_specmm.api as A, hf_specmm._compat as C
from hf_specmm.auto.budget import AutoBudget
from world_batch1 import world_batch1
name = sys.argv[1]
world, target, x1, gen = world_batch1()
auto = hf_specmm.Auto(world.drafts[name], max_tokens=64)
for c in range(72): target.generate(**x1[c % 32], **gen, assistant_model=auto)
spent = collections.Counter()  # this call's seconds per part
def timed(owner, attr, key):
    f = getattr(owner, attr)
    def w(*a, **k):
        s = time.perf_counter(); r = f(*a, **k); spent[key] += time.perf_counter() - s; return r
    setattr(owner, attr, w)
timed(A, "resolve_plan", "resolve_plan"); timed(AutoBudget, "runs_plain", "runs_plain"); timed(AutoBudget, "report", "report")
timed(C, "stock_generate", "stock generate")
if sys.argv[2:] == ["force"]:
    chosen = AutoBudget.runs_plain
    AutoBudget.runs_plain = lambda self: chosen(self) or True
total = collections.Counter(); pairs = 0
for c in range(128):
    x, parts = x1[c % 32], {}
    for k in (("plain", "auto") if c % 2 else ("auto", "plain")):
        spent.clear(); s = time.perf_counter()
        target.generate(**x, **gen, **({} if k == "plain" else {"assistant_model": auto}))
        parts[k] = dict(spent, call=time.perf_counter() - s)
        if k == "auto": as_plain = hf_specmm.last_stats(target).auto["shapes"] == ["plain generate"]
    if as_plain:
        pairs += 1
        for k, p in parts.items():
            for part, v in p.items(): total[(k, part)] += v
print(f"{pairs} of 128 pairs with Auto's call run as plain generate; ms per call:")
for (k, part), v in sorted(total.items()): print(f"  {k:5s} {part:15s} {1e3 * v / pairs:7.3f}")
print(f"  Auto / plain generate, whole calls: {total[('auto', 'call')] / total[('plain', 'call')]:.3f}")
