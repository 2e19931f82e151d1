"""World batch 1: is a speculative call slower right after a run of plain generate calls (as Auto's checks are) than
after speculative calls? Per cycle, for a prompt: K plain generate calls then a fixed chain g call ("after plain"),
K chain g calls then a chain g call ("after spec"); the timed calls are of the same prompt. argv: draft g cycles K"""
import sys, time, statistics
import hf_specmm
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "session22"))
from world_batch1 import world_batch1
name, g, cycles, K = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
world, target, x1, gen = world_batch1()
d = world.drafts[name]
spec = dict(assistant_model=d, num_assistant_tokens=g)
for c in range(16): target.generate(**x1[c % 32], **spec, **gen); target.generate(**x1[c % 32], **gen)
t = {"after plain": [], "after spec": [], "plain after spec": [], "plain after plain": []}
for c in range(cycles):
    x = x1[c % 32]
    order = ("plain", "spec") if c % 2 else ("spec", "plain")
    for before in order:
        for k in range(K): target.generate(**x1[(c + k + 1) % 32], **(spec if before == "spec" else {}), **gen)
        s = time.perf_counter(); target.generate(**x, **spec, **gen); t[f"after {before}"].append(time.perf_counter() - s)
        s = time.perf_counter(); target.generate(**x, **gen); t[f"plain after {'spec' if before == 'spec' else 'plain'}"].append(time.perf_counter() - s)
ratios = [a / b for a, b in zip(t["after plain"], t["after spec"])]
print({k: round(1e3 * statistics.median(v), 2) for k, v in t.items()})
print("spec call after plain / after spec: median of per-prompt ratios %.3f, sum ratio %.3f" % (statistics.median(ratios), sum(t["after plain"]) / sum(t["after spec"])))
