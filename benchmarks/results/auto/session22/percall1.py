"""World batch 1: after 40 warm-up Auto calls, per prompt in turns: fixed chains (argv g list), Auto(shapes=[g0]) and Auto.
Per method sum of time; Auto's per call what it took. argv: draft, cycles, g0, g1..."""
import sys, time, statistics, collections
import hf_specmm
from world_batch1 import world_batch1
name, cycles, gs = sys.argv[1], int(sys.argv[2]), [int(v) for v in sys.argv[3:]]
world, target, x1, gen = world_batch1()
d = world.drafts[name]
auto, autog = hf_specmm.Auto(d, max_tokens=64), hf_specmm.Auto(d, max_tokens=64, shapes=[gs[0]])
for c in range(40): target.generate(**x1[c % 32], **gen, assistant_model=auto)
for c in range(8): target.generate(**x1[c % 32], **gen, assistant_model=autog)
methods = {f"fixed{g}": dict(assistant_model=d, num_assistant_tokens=g) for g in gs}
methods["plain"] = {}
methods["autog"] = dict(assistant_model=autog); methods["auto"] = dict(assistant_model=auto)
tot = collections.defaultdict(list); what = collections.Counter(); per = []
for c in range(cycles):
    for i, x in enumerate(x1):
        names = list(methods); k0 = (c + i) % len(names); names = names[k0:] + names[:k0]
        t = {}
        for k in names:
            s = time.perf_counter(); target.generate(**x, **methods[k], **gen); t[k] = time.perf_counter() - s
            if k == "auto":
                a = hf_specmm.last_stats(target).auto
                w = "PLAIN" if a["shapes"] == ["plain generate"] else ",".join(f"{s}:{n}" for s, n in collections.Counter(a["shapes"]).most_common(2))
                t["what"] = w + (f" expl{a['explored_rounds']}" if a["explored_rounds"] else "")
        per.append((c, i, t))
        for k in methods: tot[(c, k)].append(t[k])
    print("cycle", c, " ".join(f"{k} {sum(tot[(c, k)]):.3f}" for k in methods), flush=True)
f0 = f"fixed{gs[0]}"
for c, i, t in per:
    print(c, i, f"{f0} {1e3*t[f0]:6.1f}", " ".join(f"{k}/{f0} {t[k]/t[f0]:.3f}" for k in methods if k != f0), t["what"])
for k in methods:
    print(k, "sum ratio vs", f0, round(sum(t[k] for _, _, t in per) / sum(t[f0] for _, _, t in per), 3))
