"""evalsum.py <bench.json>...: each Auto row's evaluation (the grid's best row re-timed beside Auto and plain),
paired by pass (the median over passes of the two methods' times in that pass) and as a ratio of median times."""
import json, statistics as st, sys

for f in sys.argv[1:]:
    for r in json.load(open(f))["rows"]:
        if r.get("tree") != "auto" or "eval" not in r:
            continue
        t = r["eval"]["times_s"]
        paired = st.median(a / b for a, b in zip(t["auto"], t["best"]))
        print(f"{f} b{r['batch']} best {r['best_fixed']} | Auto/best paired {paired:.3f} (speed {1 / paired:.3f}), "
              f"of medians {st.median(t['auto']) / st.median(t['best']):.3f} | Auto x plain paired "
              f"{st.median(p / a for p, a in zip(t['plain'], t['auto'])):.3f}, best x plain "
              f"{st.median(p / b for p, b in zip(t['plain'], t['best'])):.3f} | warm-up calls "
              f"{r['eval'].get('auto_warmup_calls', 0)} | lossless {r['eval']['lossless']}")
        print("   Auto's shapes:", r["eval"]["auto_shapes"])
        print("   per pass Auto/best:", [round(a / b, 3) for a, b in zip(t["auto"], t["best"])])
