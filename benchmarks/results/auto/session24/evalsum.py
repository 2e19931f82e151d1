import json,sys,statistics as st
for f in sys.argv[1:]:
    d=json.load(open(f))
    for r in d["rows"]:
        if r.get("tree")=="auto" and "eval" in r:
            e=r["eval"]; t=e["times_s"]
            ratios=[a/p for a,p in zip(t["auto"],t["plain"])]
            print(f, "b%d"%r["batch"], r["best_fixed"], "auto x plain %.3f"%e["auto_speedup"], "best x plain %.3f"%e["best_speedup"], "auto/best %.3f"%r["auto_over_best"], "lossless", e["lossless"])
            print("   shapes", e["auto_shapes"], " per-pass ratio median %.3f"%st.median(ratios))
