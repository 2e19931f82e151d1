"""What the answer book and the per-depth table make of batch-8 rounds, from a match-length file (session20's
match_lengths.py: per prompt, the drafts a chain 8 keeps when its round starts after t + 1 known tokens).

For each observed chain g0: the rounds a call of chain g0 takes over the 32 answers (4 calls of 8) and what they
record: per token, kept at depth d or missed at depth d, the rest unknown. Then per chain g = 1..8, the most rounds
a row of each call takes (mean over the calls), three ways: true (from the match lengths), the book (a missed
token hard and a kept one easy at every depth, unknown ones at the table's miss rate of their depth), the table
(every token missed at the per-depth rate the g0 calls measured, deeper depths at g0's). Prints the book's and
the table's error per g. ``--read``: the book also knows each unknown token's depth-1 outcome (what a feature
head's first choice at the pending slots would tell).

    python book_rounds.py ../session20/mt-feature-head.json [--read]
"""
import json
import sys

rows = json.load(open(sys.argv[1]))
READ = "--read" in sys.argv[2:]
G = 8


def true_rounds(r, g):
    known, n = 1, 0
    while known < r["L"]:
        known += min(r["m"][known - 1], g) + 1
        n += 1
    return n


def observe(r, g0):
    seen, known = {}, 1
    while known < r["L"]:
        kept = min(r["m"][known - 1], g0)
        for i in range(kept):
            if known + i < r["L"]:
                seen[known + i] = ("kept", i + 1)
        if kept < g0 and known + kept < r["L"]:
            seen[known + kept] = ("missed", kept + 1)
        known += kept + 1
    return seen


def with_reads(r, seen):
    told = dict(seen)
    for j in range(1, r["L"]):
        if j not in told:
            told[j] = ("kept", 1) if r["m"][j - 1] >= 1 else ("missed", 1)
    return told


def miss_rates(seen_all, g0):
    reached, missed = [0] * (G + 2), [0] * (G + 2)
    for seen in seen_all:
        for kind, d in seen.values():
            for dd in range(1, d + 1):
                reached[dd] += 1
            missed[d] += kind == "missed"
    q = [missed[d] / reached[d] if reached[d] else 0.0 for d in range(G + 2)]
    return [q[min(d, g0)] for d in range(G + 2)]


def expected_rounds(length, g, p_miss):
    rounds = [0.0] * (length + 2)
    for k in range(length - 1, 0, -1):
        reach, total = 1.0, 0.0
        for i in range(g):
            j = k + i
            if j >= length:
                break
            p = p_miss(j, i + 1)
            total += reach * p * rounds[j + 1]
            reach *= 1 - p
        rounds[k] = 1 + total + reach * rounds[min(k + g + 1, length)]
    return rounds[1]


for g0 in (8, 7, 6, 5, 4, 3):
    seen_all = [observe(r, g0) for r in rows]
    q = miss_rates(seen_all, g0)
    if READ:
        seen_all = [with_reads(r, s) for r, s in zip(rows, seen_all)]
    line = {"book": [], "table": []}
    for g in range(1, G + 1):
        def calls(f):
            return sum(max(f(r, s) for r, s in zip(rows[i:i + 8], seen_all[i:i + 8])) for i in range(0, len(rows), 8)) / (len(rows) // 8)

        true = calls(lambda r, s: true_rounds(r, g))
        book = calls(lambda r, s: expected_rounds(
            r["L"], g, lambda j, d: q[d] if j not in s else float(s[j][0] == "missed")))
        table = calls(lambda r, s: expected_rounds(r["L"], g, lambda j, d: q[d]))
        line["book"].append(f"{book / true - 1:+.0%}")
        line["table"].append(f"{table / true - 1:+.0%}")
    print(f"from chain {g0}: book  {' '.join(line['book'])}\n              table {' '.join(line['table'])}")
