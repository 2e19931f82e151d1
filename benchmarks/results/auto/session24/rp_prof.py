import cProfile, pstats, time, torch, hf_specmm
from hf_specmm.checks import resolve_plan
from hf_specmm.bench.presets import build_preset, synthetic_inputs
torch.set_num_threads(2)
p = build_preset("tiny"); target = p.target; hf_specmm.enable(target)
x = synthetic_inputs(p, 1, 32)
gen = dict(max_new_tokens=64, do_sample=False, min_new_tokens=64)
auto = hf_specmm.Auto(p.draft, max_tokens=64)
for c in range(10): target.generate(**x, **gen, assistant_model=auto)
ids = x["input_ids"]; kw = {k: v for k, v in x.items() if k != "input_ids"}; kw.update(gen)
def once(): return resolve_plan(target, auto, ids, None, None, dict(kw))
for _ in range(50): once()
s = time.perf_counter(); [once() for _ in range(500)]; print("ms per call", (time.perf_counter() - s) * 2)
pr = cProfile.Profile(); pr.enable(); [once() for _ in range(500)]; pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
