"""World batch 8, one process: Auto as auto_world runs it (40 batch-1 calls, then N batch-8 calls), then in turns
`cycles` times: fixed chains 1..8 (Auto(shapes=[g])) and Auto. Prints one JSON line: Auto's time over the best fixed
chain's, the chain its batch-8 ranking puts first and that chain's time over the best's, Auto's shapes in the turns.
VARIANT env: 'base', or 'ends' (batch rounds ranked with the answers' ends). P env: prompts (32: four batch-8
calls a cycle)."""
import sys, os, time, json, collections, statistics
import hf_specmm
from hf_specmm.auto.budget import AutoBudget
from hf_specmm.auto.store import COSTS
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
variant = os.environ.get("VARIANT", "base")
if variant == "ends":  # batch rounds ranked with the answers' ends, as single rows are
    import hf_specmm.auto.policy as P
    _rank = P.CostAwarePolicy.rank
    P.CostAwarePolicy.rank = lambda self, a, c, rows, batch=False: _rank(self, a, c, rows, False)
name = sys.argv[1]; n8 = int(sys.argv[2]); cycles = int(sys.argv[3])
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
NP = int(os.environ.get("P", "32"))
ex = [e for task in eval_examples(-(-NP // 3)).values() for e in task][:NP]
X8 = [encode_prompts(processor, ex[i:i + 8], "raw", target.device) for i in range(0, NP, 8)]
x1 = [encode_prompts(processor, ex[i:i+1], "raw", target.device) for i in range(NP)]
gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
d = world.drafts[name]
auto = hf_specmm.Auto(d, max_tokens=64)
for c in range(40): target.generate(**x1[c % len(x1)], **gen, assistant_model=auto)
for c in range(n8): target.generate(**X8[c % len(X8)], **gen, assistant_model=auto)
fixed = {g: hf_specmm.Auto(d, max_tokens=64, shapes=[g]) for g in range(1, 9)}
cur = {"g": None}; per = collections.defaultdict(list)
cl = AutoBudget._close
def _close(self, now, timed):
    o = self.open
    if o is not None and cur["g"] in ("auto", 2, best_guess):
        per[(cur["g"], o["shape"].label, o["rows"], o["choice"].explored)].append(now - o["start"])
    cl(self, now, timed)
AutoBudget._close = _close
best_guess = int(os.environ.get("BEST", "2"))
explored = []; names = list(range(1, 9)) + ["auto"]; times = collections.defaultdict(list); shapes = collections.Counter()
for c in range(cycles):
    order = names[c % len(names):] + names[:c % len(names)]
    for g in order:
        cur['g'] = g; total = 0.0
        for x8 in X8:
            s = time.perf_counter(); target.generate(**x8, **gen, assistant_model=auto if g == "auto" else fixed[g])
            total += time.perf_counter() - s
            if g == "auto":
                shapes.update(hf_specmm.last_stats(target).auto["shapes"]); explored.append(hf_specmm.last_stats(target).auto["explored_rounds"])
        times[g].append(total)
med = {g: statistics.median(v) for g, v in times.items()}
best = min(range(1, 9), key=med.get)
table = next(t for k, t in COSTS.tables.items() if "batch<=8" in k)
budget = auto.budget(target, 8, False, next(k for k in COSTS.tables if "batch<=8" in k).split(" | ")[-1], True, True, target.device)
ranked = budget.policy.rank(auto.acceptance(target), table, 1, True)
top = next(c.shape.gamma for c in ranked if c.shape.tree is None and c.shape.gamma)
print(json.dumps({"variant": variant, "prompts": NP, "draft": name, "auto_over_best": med["auto"] / med[best], "best": best,
                  "ranked_chain": top, "ranked_over_best": med[top] / med[best],
                  "fixed_ms": {g: round(1e3 * med[g], 1) for g in range(1, 9)},
                  "shapes": shapes.most_common(4), "explored_per_call": sum(explored) / len(explored)}), flush=True)
if os.environ.get("ROUNDS"):
    for k, v in sorted(per.items(), key=lambda kv: (str(kv[0][0]), -kv[0][2])):
        print(f"  {str(k[0]):5s} {k[1]:12s} rows {k[2]} explored {k[3]!s:5s} n {len(v):3d} median {1e3*statistics.median(v):5.2f} ms sum/cycle {1e3*sum(v)/cycles:6.2f}")
