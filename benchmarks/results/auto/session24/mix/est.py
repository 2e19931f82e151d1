import json, sys, statistics as st, random
rows = [json.loads(l) for l in open(sys.argv[1])]
plain = [r for r in rows if r["kind"] == "plain"]; spec = [r for r in rows if r["kind"] == "spec"]
print("truth: sum plain wall / sum spec wall", round(sum(r["wall"] for r in plain) / sum(r["wall"] for r in spec), 3))
L = [r["logged"][0][1][3] for r in spec]  # the calls' lengths (the speculative side's record)
def share(po, s, so, rate, rs, L=L):
    return sum(po + s * n for n in L) / sum(so + max(n / rate, rs) for n in L)
seq = [r for r in rows if r["logged"]]
pairs = {"median rates (now)": [], "pooled rates": [], "pooled rates, plain overhead median of 3": []}
plain_hist = []
for k, r in enumerate(seq):
    if r["kind"] != "plain":
        continue
    po, s, n = r["logged"][0][1]
    plain_hist.append(po)
    before = [x for x in seq[:k] if x["kind"] == "spec" and x["logged"][0][1][0] is not None][-3:]
    if len(before) < 3:
        continue
    a = [x["logged"][0][1] for x in before]  # rate, round_s, overhead, tokens
    rate_med = st.median(v[0] for v in a); so = st.median(v[2] for v in a); rs = st.median(v[1] for v in a)
    pooled = sum(v[3] for v in a) / sum(v[3] / v[0] for v in a)
    pairs["median rates (now)"].append(share(po, s, so, rate_med, rs))
    pairs["pooled rates"].append(share(po, s, so, pooled, rs))
    pairs["pooled rates, plain overhead median of 3"].append(share(st.median(plain_hist[-3:]), s, so, pooled, rs))
for name, v in pairs.items():
    random.seed(0)
    meds = [st.median(random.sample(v, 9)) for _ in range(2000)]
    print(f"{name:45s} per-pair median {st.median(v):.3f}; median of 9 random pairs: mean {st.mean(meds):.3f} sd {st.pstdev(meds):.3f}; mean of pairs {st.mean(v):.3f}")
# the plain overhead against a plain call's prefill alone: which prompts
po = [(r["prompt"], round(1e3 * r["logged"][0][1][0], 2), r["logged"][0][1][2]) for r in plain if r["logged"]]
print("plain overheads ms (prompt, ms, tokens), first 32:", po[:32])
sp = [(r["prompt"], round(1e3 * r["logged"][0][1][2], 2), r["logged"][0][1][0] and round(r["logged"][0][1][0])) for r in spec]
print("spec (prompt, overhead ms, rate):", sp[:32])
