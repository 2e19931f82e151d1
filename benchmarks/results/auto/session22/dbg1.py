import sys, time, collections
import hf_specmm
from hf_specmm.auto.store import COSTS
from world_batch1 import world_batch1
name = sys.argv[1]
world, target, x1, gen = world_batch1()
d = world.drafts[name]
auto = hf_specmm.Auto(d, max_tokens=64)
for c in range(40): target.generate(**x1[c % 32], **gen, assistant_model=auto)
for c in range(64):
    s = time.perf_counter(); target.generate(**x1[c % 32], **gen, assistant_model=auto); el = time.perf_counter() - s
    a = hf_specmm.last_stats(target).auto
    acc = auto.acceptance(target)
    key = next(k for k in COSTS.tables if "batch<=1 " in k)
    table = COSTS.tables[key]
    r = acc.rankings.get(table)
    top = [(x.shape.label, round(x.predicted_tokens_per_s)) for x in r["ranked"][:3]] if r else None
    w = "PLAIN" if a["shapes"] == ["plain generate"] else ",".join(f"{s}:{n}" for s, n in collections.Counter(a["shapes"]).most_common(3))
    print(c, f"{1e3*el:5.1f}", w, "| y", round(acc.yield_of("chain"), 3), "pooled", round(acc.pooled_yield(), 3), "speed", round(table.speed, 3), "fac", round(table.time_factor("chain"), 3), "lam", round(acc.end_hazard(), 3), "| top", top,
          "| book", [round(v, 2) for v in (acc.answers.chain_tokens(False) or [])][:8], "share", table.stock_share() and round(table.stock_share(), 3), flush=True)
