"""Image adapter (argv[1] draft) at batch 8 on 32 prompts: per chain γ, the batch-8 ranking's prediction (critical
tokens per round, round seconds) against fixed chains' calls (rounds, longest rows, decode seconds)."""
import sys, os, time, json, collections, statistics
import torch
import hf_specmm
from hf_specmm.auto.store import COSTS
from hf_specmm.auto.policy import Shape
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
name = sys.argv[1]; cycles = int(sys.argv[2])
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
NP = 32
ex = [e for task in eval_examples(-(-NP // 3)).values() for e in task][:NP]
X8 = [encode_prompts(processor, ex[i:i + 8], "raw", target.device) for i in range(0, NP, 8)]
x1 = [encode_prompts(processor, ex[i:i+1], "raw", target.device) for i in range(NP)]
gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
d = world.drafts[name]
auto = hf_specmm.Auto(d, max_tokens=64)
for c in range(40): target.generate(**x1[c % len(x1)], **gen, assistant_model=auto)
for c in range(24): target.generate(**X8[c % len(X8)], **gen, assistant_model=auto)
key = next(k for k in COSTS.tables if "batch<=8" in k)
table = COSTS.tables[key]
budget = auto.budget(target, 8, False, key.split(" | ")[-1], True, True, target.device)
acc = auto.acceptance(target)
pol = budget.policy
ranked = pol.rank(acc, table, 8, True)
single = {c.shape: c for c in pol.rank(acc, table, 8, False)}
eos = set(target.generation_config.eos_token_id if isinstance(target.generation_config.eos_token_id, list) else [target.generation_config.eos_token_id])
factor = table.time_factor("chain")
pred = {}
for c in ranked:
    if c.shape.tree is None and c.shape.gamma:
        realised = c.curve_seconds * factor
        scored = c.predicted_tokens_per_s * realised / 8
        pred[c.shape.gamma] = (scored, c.expected_tokens, realised, c.predicted_tokens_per_s, single[c.shape].predicted_tokens_per_s)
fixed = {g: hf_specmm.Auto(d, max_tokens=64, shapes=[g]) for g in range(1, 9)}
rec = collections.defaultdict(lambda: {"rounds": [], "L": [], "decode": [], "call": [], "rows_rounds": []})
for c in range(cycles):
    order = list(range(1, 9)); order = order[c % 8:] + order[:c % 8]
    for g in order:
        for x in X8:
            s = time.perf_counter(); out = target.generate(**x, **gen, assistant_model=fixed[g]); t = time.perf_counter() - s
            st = hf_specmm.last_stats(target).auto
            new = out[:, x["input_ids"].shape[1]:].tolist()
            lens = []
            for row in new:
                n = len(row)
                for i, tok in enumerate(row):
                    if tok in eos: n = i + 1; break
                lens.append(n)
            r = rec[g]; r["rounds"].append(len(st["shapes"])); r["L"].append(max(lens))
            r["decode"].append(sum(v["seconds"] for v in st["per_shape"].values())); r["call"].append(t)
print(f"factor {factor:.3f}; draft {name}")
print(" γ  pred: crit  ends  round_ms  tok/s(b)  tok/s(1) | meas: rounds/call  L/round  ms/round  L/s(decode)  call ms")
for g in range(1, 9):
    r = rec[g]; sc, en, rt, pb, p1 = pred[g]
    n = len(r["rounds"])
    rounds = sum(r["rounds"]) / n; L = sum(r["L"]) / n; dec = sum(r["decode"]) / n; call = statistics.median([sum(r["call"][i:i+4]) for i in range(0, n, 4)])
    print(f"{g:2d}  {sc:10.2f} {en:5.2f} {1e3*rt:8.2f} {pb:9.0f} {p1:9.0f} | {rounds:12.2f} {L/rounds:8.2f} {1e3*dec/rounds:9.2f} {L/dec:11.1f} {1e3*call:8.1f}")
