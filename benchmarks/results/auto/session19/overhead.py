"""World batch B (after auto_world's flow): in turns, a real fixed chain g (num_assistant_tokens), Auto(shapes=[g]) and
Auto; call ms medians; cProfile of 20 Auto calls' cumulative time in hf_specmm.auto. argv: draft, g, cycles, batch."""
import sys, time, collections, statistics, cProfile, pstats, io
import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
name = sys.argv[1]; g = int(sys.argv[2]); cycles = int(sys.argv[3]); batch = int(sys.argv[4]) if len(sys.argv) > 4 else 8
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
ex = [e for task in eval_examples(3).values() for e in task][:8]
xs = [encode_prompts(processor, ex[i:i + batch], "raw", target.device) for i in range(0, 8, batch)]
x1 = [encode_prompts(processor, ex[i:i+1], "raw", target.device) for i in range(8)]
gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
d = world.drafts[name]
auto = hf_specmm.Auto(d, max_tokens=64); fixed = hf_specmm.Auto(d, max_tokens=64, shapes=[g])
for c in range(40): target.generate(**x1[c % 8], **gen, assistant_model=auto)
for c in range(24): target.generate(**xs[c % len(xs)], **gen, assistant_model=auto)
methods = {"chain": dict(assistant_model=d, num_assistant_tokens=g), "Auto[g]": dict(assistant_model=fixed), "Auto": dict(assistant_model=auto)}
times = collections.defaultdict(list)
for c in range(cycles):
    names = list(methods); names = names[c % 3:] + names[:c % 3]
    for x in xs:
        for n in names:
            s = time.perf_counter(); target.generate(**x, **gen, **methods[n]); times[n].append(time.perf_counter() - s)
base = statistics.median(times["chain"])
for n in methods:
    print(f"{n:8s} {1e3*statistics.median(times[n]):7.2f} ms  {statistics.median(times[n])/base:.3f}x chain {g}")
for n in ("chain", "Auto"):
    prof = cProfile.Profile(); prof.enable()
    for c in range(20):
        for x in xs: target.generate(**x, **gen, **methods[n])
    prof.disable(); s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25); print("=== profile", n); print(s.getvalue()[:6000])
