"""Rounds of chains 1-8 simulated from a match-length file (match_lengths.py): per batch-8 call of the 32 prompts
(4 calls), the most rounds a row takes; set against the rounds session 19 measured (b8-image-adapter.txt there)."""
import json, sys
rows = json.load(open(sys.argv[1]))
def rounds(r, g):
    known, n = 1, 0
    while known < r["L"]:
        known += min(r["m"][known - 1], g) + 1; n += 1
    return n
meas = [18.5, 13.5, 10.75, 9.0, 8.25, 7.5, 7.0, 6.75]
for g in range(1, 9):
    calls = [max(rounds(r, g) for r in rows[i:i + 8]) for i in range(0, 32, 8)]
    rr = [rounds(r, g) for r in rows]
    print(g, calls, sum(calls) / 4, "measured", meas[g - 1], "row-round-sum", sum(rr))
