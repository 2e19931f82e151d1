import sys, time, collections
import hf_specmm
from hf_specmm.auto.store import COSTS
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
name = sys.argv[1]
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
ex = [e for task in eval_examples(11).values() for e in task][:32]
x1 = [encode_prompts(processor, ex[i:i+1], "raw", target.device) for i in range(32)]
gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
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
