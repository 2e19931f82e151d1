"""World batch 8 after the regret flow (40 batch-1 and 24 batch-8 Auto calls): per prompt batch of the 32 prompts, in
turns, a fixed chain g (num_assistant_tokens), Auto(shapes=[g]) and Auto; per call the ratios over the fixed chain,
what Auto's call took (PLAIN: run as plain generate; shapes; explored rounds) and the ms each spent outside its
rounds. argv: draft, g, cycles."""
import sys, time, statistics, collections
import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
name, g, cycles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
ex = [e for task in eval_examples(11).values() for e in task][:32]
X8 = [encode_prompts(processor, ex[i:i + 8], "raw", target.device) for i in range(0, 32, 8)]
x1 = [encode_prompts(processor, ex[i:i+1], "raw", target.device) for i in range(32)]
gen = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)
d = world.drafts[name]
auto, autog = hf_specmm.Auto(d, max_tokens=64), hf_specmm.Auto(d, max_tokens=64, shapes=[g])
for c in range(40): target.generate(**x1[c % 32], **gen, assistant_model=auto)
for c in range(24): target.generate(**X8[c % 4], **gen, assistant_model=auto)
for c in range(8): target.generate(**X8[c % 4], **gen, assistant_model=autog)
methods = {"fixed": dict(assistant_model=d, num_assistant_tokens=g), "autog": dict(assistant_model=autog), "auto": dict(assistant_model=auto)}
rows = []
for c in range(cycles):
    for i, x in enumerate(X8):
        t = {}
        names = list(methods); names = names[(c + i) % 3:] + names[:(c + i) % 3]
        for k in names:
            s = time.perf_counter(); target.generate(**x, **methods[k], **gen); t[k] = time.perf_counter() - s
            if k == "auto":
                st = hf_specmm.last_stats(target); a = st.auto
                inside = sum(v["seconds"] for v in a["per_shape"].values())
                what = "PLAIN" if a["shapes"] == ["plain generate"] else ",".join(f"{s}:{n}" for s, n in collections.Counter(a["shapes"]).most_common(3))
                t["auto_out"] = t["auto"] - inside; t["what"] = what + (f" expl{a['explored_rounds']}" if a["explored_rounds"] else "")
            if k == "autog":
                a = hf_specmm.last_stats(target).auto; t["autog_out"] = t["autog"] - sum(v["seconds"] for v in a["per_shape"].values())
        rows.append((c, i, t))
        print(c, i, f"fixed {1e3*t['fixed']:6.1f} autog/fixed {t['autog']/t['fixed']:.3f} auto/fixed {t['auto']/t['fixed']:.3f} out(ms) autog {1e3*t['autog_out']:5.1f} auto {1e3*t['auto_out']:5.1f}  {t['what']}", flush=True)
for k in ("autog", "auto"):
    print(k, "median ratio", round(statistics.median(r[2][k] / r[2]["fixed"] for r in rows), 3),
          "sum ratio", round(sum(r[2][k] for r in rows) / sum(r[2]["fixed"] for r in rows), 3))
