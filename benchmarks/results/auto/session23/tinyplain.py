"""tiny preset: what an Auto call run as plain generate spends beside plain generate's own call (every Auto call
forced to plain generate, its choice still made). Per part (ms per call): resolve_plan and its pieces, runs_plain,
report, stock generate inside. argv: batch [calls]"""
import sys, time, collections
import torch
import hf_specmm, hf_specmm.api as A, hf_specmm._compat as C, hf_specmm.checks as K
from hf_specmm.auto.budget import AutoBudget
from hf_specmm.bench.presets import build_preset, synthetic_inputs
from timers import timed
torch.set_num_threads(2)
batch, calls = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 96
p = build_preset("tiny")
target = p.target; hf_specmm.enable(target)
x = synthetic_inputs(p, batch, 32)
gen = dict(max_new_tokens=64, do_sample=False, min_new_tokens=64)
auto = hf_specmm.Auto(p.draft, max_tokens=64)
for c in range(40): target.generate(**x, **gen, assistant_model=auto)
spent = collections.Counter()
timed(A, "resolve_plan", "resolve_plan", spent); timed(AutoBudget, "runs_plain", "runs_plain", spent); timed(AutoBudget, "report", "report", spent)
timed(C, "stock_generate", "stock generate", spent); timed(AutoBudget, "timing_plain", "timing_plain", spent)
for name in ("target_spec", "kind_of", "check_vocab_compatible", "_input_ids", "_check_config", "check_placeholders",
             "VocabMap", "_check_draft", "_resolve_budget", "_gamma_source", "_check_auto"):
    timed(K, name, "  " + name, spent)
timed(C, "resolve_generation_config", "  resolve_generation_config", spent); timed(C, "unsupported_stateful_layers", "  unsupported_stateful_layers", spent)
timed(C, "stateful_layer_types", "  stateful_layer_types", spent); timed(hf_specmm.Auto, "budget", "  Auto.budget", spent)
chosen = AutoBudget.runs_plain
AutoBudget.runs_plain = lambda self: chosen(self) or True
total = collections.Counter()
for c in range(calls):
    for k in (("plain", "auto") if c % 2 else ("auto", "plain")):
        spent.clear(); s = time.perf_counter()
        target.generate(**x, **gen, **({} if k == "plain" else {"assistant_model": auto}))
        spent["call"] = time.perf_counter() - s
        for part, v in spent.items(): total[(k, part)] += v
for (k, part), v in sorted(total.items()): print(f"  {k:5s} {part:30s} {1e3 * v / calls:7.3f}")
print(f"  Auto / plain generate, whole calls: {total[('auto', 'call')] / total[('plain', 'call')]:.3f}")
