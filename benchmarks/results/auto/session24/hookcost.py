"""tiny preset, batch 1: plain generate with no hook, a no-op forward pre-hook, and the appending hook, in turns."""
import sys, time, collections, statistics as st
import torch
import hf_specmm
from hf_specmm.bench.presets import build_preset, synthetic_inputs
torch.set_num_threads(2)
batch, calls = int(sys.argv[1]), int(sys.argv[2])
p = build_preset("tiny"); target = p.target
x = synthetic_inputs(p, batch, 32)
gen = dict(max_new_tokens=64, do_sample=False, min_new_tokens=64)
starts = []
def noop(m, a): return None
def mark(m, a): starts.append(time.perf_counter())
for c in range(10): target.generate(**x, **gen)
t = collections.defaultdict(list)
for c in range(calls):
    for k in ["none", "noop", "mark"][c % 3:] + ["none", "noop", "mark"][:c % 3]:
        h = None if k == "none" else target.register_forward_pre_hook(noop if k == "noop" else mark)
        starts.clear(); s = time.perf_counter(); target.generate(**x, **gen); t[k].append(time.perf_counter() - s)
        if h: h.remove()
for k, v in t.items(): print(k, f"{1e3*st.median(v):.3f} ms  mean {1e3*st.mean(v):.3f}")
print("forwards per call", len(starts))
