"""tiny preset, the world text-only profile: the bench's Auto method (as evaluate_auto times it) beside plain, its call
split into the harness's parts (enable, set_reference, _prompt_positions, last_stats, disable) and generate.
argv: batch passes"""
import sys, time, collections, statistics as st
import torch
import hf_specmm.api as A, hf_specmm.bench.methods as M
from hf_specmm.bench.config import BenchConfig
from hf_specmm.bench.runner import BenchmarkRun, BenchStep
from hf_specmm.bench.presets import build_preset
from hf_specmm.bench.methods import PlainMethod
from hf_specmm.bench.shape_rows import calibrate_auto
from timers import timed
from hf_specmm.bench.cli import _profile
torch.set_num_threads(2)
batch, passes = int(sys.argv[1]), int(sys.argv[2])
config = BenchConfig(preset="tiny", gammas=[3], batch_sizes=[batch], max_new_tokens=64, warmup=1, repeats=5, stock=False,
                     acceptance_profile=_profile("world_profile_text-only-distilled.json"), auto=True, auto_eval_repeats=15)
run = BenchmarkRun(config, build_preset("tiny"))
step = BenchStep(run, batch, 3, trees=[], auto=True)
auto = step.ours_auto["text_only_auto"]
calibrate_auto(step, auto)
plain = PlainMethod(step)
for _ in range(20): plain(); auto()
spent = collections.Counter()
for name in ("enable", "disable", "last_stats"): timed(A, name, name, spent)
for name in ("set_reference", "_prompt_positions"): timed(M, name, name, spent)
gen = type(step.target).generate
t = collections.defaultdict(list)
for c in range(passes):
    for k in (("plain", "auto") if c % 2 else ("auto", "plain")):
        spent.clear(); s = time.perf_counter(); (plain if k == "plain" else auto)(); t[k].append(time.perf_counter() - s)
        for part, v in spent.items(): t[(k, part)].append(v)
for k, v in t.items(): print(k, f"median {1e3*st.median(v):.3f} ms  mean {1e3*st.mean(v):.3f}")
print("auto/plain medians", st.median(t["auto"]) / st.median(t["plain"]))
print(collections.Counter(s.auto["shapes"][0] if s.auto["shapes"] else None for s in auto.stats[-passes:]))
