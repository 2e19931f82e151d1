"""World batch 1: is a plain generate call slower right after a run of speculative calls (as Auto's checks in a
speculative regime are) than after plain generate calls? Per cycle, for a prompt: K fixed chain g calls then a plain
generate call ("after spec"), K plain generate calls then a plain generate call ("after plain"), alternating which
first; the timed calls are of the same prompt. Also the time to the first decoding forward (prefill + set-up).
argv: draft g cycles K"""
import sys, time, statistics
import torch
from world_batch1 import world_batch1
torch.set_num_threads(2)
name, g, cycles, K = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
world, target, x1, gen = world_batch1()
spec = dict(assistant_model=world.drafts[name], num_assistant_tokens=g)
for c in range(16): target.generate(**x1[c % 32], **spec, **gen); target.generate(**x1[c % 32], **gen)
starts = []
t = {"after spec": [], "after plain": []}; pre = {"after spec": [], "after plain": []}
for c in range(cycles):
    x = x1[c % 32]
    for before in (("plain", "spec") if c % 2 else ("spec", "plain")):
        for k in range(K): target.generate(**x1[(c + k + 1) % 32], **(spec if before == "spec" else {}), **gen)
        starts.clear(); h = target.register_forward_pre_hook(lambda m, a: starts.append(time.perf_counter()))
        s = time.perf_counter(); target.generate(**x, **gen); e = time.perf_counter(); h.remove()
        t[f"after {before}"].append(e - s)
        if len(starts) >= 2: pre[f"after {before}"].append(starts[1] - s)
r = [a / b for a, b in zip(t["after spec"], t["after plain"])]
print({k: round(1e3 * statistics.median(v), 2) for k, v in t.items()}, "to the first decoding forward:",
      {k: round(1e3 * statistics.median(v), 2) for k, v in pre.items()})
print("plain generate after spec / after plain: median of per-prompt ratios %.3f, sum ratio %.3f"
      % (statistics.median(r), sum(t["after spec"]) / sum(t["after plain"])))
