"""cpu-proxy at batch 1 under the world's text-only profile, draws per call: an Auto row's calls one by one after its
calibration (what bench's timed and evaluation calls see), per call its seconds, shapes, explored rounds and the
per-shape predicted / measured tokens per second; every `--every` calls a fixed chain's call on the same pattern."""
import argparse, collections, json, time
import hf_specmm
from hf_specmm.bench.config import BenchConfig
from hf_specmm.bench.presets import build_preset
from hf_specmm.bench.runner import BenchmarkRun, BenchStep
from hf_specmm.bench.shape_rows import calibrate_auto
from hf_specmm.auto.acceptance import read_profile
p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=20); p.add_argument("--batch", type=int, default=1)
p.add_argument("--gamma", type=int, default=5); p.add_argument("--profile", required=True)
p.add_argument("--draws", default="per-call")
a = p.parse_args()
config = BenchConfig(preset="cpu-proxy", gammas=[a.gamma], batch_sizes=[a.batch], max_new_tokens=40,
                     acceptance_profile=read_profile(a.profile), auto=True, stock=False, acceptance_draws=a.draws)
run = BenchmarkRun(config, build_preset(config.preset, config.device, config.dtype, config.seed, config.device_map))
step = BenchStep(run, a.batch, a.gamma, auto=True)
auto, fixed = step.ours_auto["text_only_auto"], step.ours["text_only"]
print("calibration calls", calibrate_auto(step, auto))
for k in range(a.calls):
    out = {}
    for name, m in (("auto", auto), ("fixed", fixed)):
        m.prepare(); s = time.perf_counter(); m(); out[name] = time.perf_counter() - s
    st = auto.stats[-1].auto
    shapes = collections.Counter(st["shapes"])
    per = {k2: (v["rounds"], round(v["predicted_tokens_per_s"] or 0, 1), round(v["measured_tokens_per_s"] or 0, 1))
           for k2, v in st["per_shape"].items()}
    print(f"call {k}: auto {out['auto']:.2f}s chain{a.gamma} {out['fixed']:.2f}s ratio {out['auto']/out['fixed']:.3f} "
          f"explored {st['explored_rounds']} {dict(shapes)} | {per}", flush=True)
print("acceptance", json.dumps(st["acceptance"]))
