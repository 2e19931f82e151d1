"""Per match-length file (match_lengths.py): at each position whose chain-8 match m is uncut (0 < m < 8), whether
the position after it reads m - 1 (a countdown kept: the miss depends on the token, not on the round's start)."""
import json, sys
for f in sys.argv[1:]:
    rows = json.load(open(f)); ok = bad = 0
    for r in rows:
        m = r["m"]
        for t in range(len(m) - 1):
            if 0 < m[t] < 8:  # uncapped countdown: the next start should read m[t]-1
                if m[t + 1] == m[t] - 1: ok += 1
                else: bad += 1
    print(f, "countdown kept", ok, "broken", bad)
