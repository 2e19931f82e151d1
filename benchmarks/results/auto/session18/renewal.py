import functools
def dist(a, g):
    # P(tokens in a round = k), k = 1..g+1, for a row that does not end: k-1 drafts accepted
    out, path = [], 1.0
    for k in range(g):
        out.append(path * (1 - a[k])); path *= a[k]
    out.append(path); return out
def rounds(a, g, L):
    p = dist(a, g)
    R = [0.0] * (L + 1)
    for n in range(1, L + 1):
        R[n] = 1 + sum(pk * R[max(n - (k + 1), 0)] for k, pk in enumerate(p))
    return R[L]
cases = {
 "feature head": ([0.996, 0.995, 0.9, 0.935, 0.931, 0.85, 0.99, 0.99], 34,
   [108.8, 91.5, 91.8, 83.0, 81.6, 85.7, 77.7, 85.6], [5.37, 6.81, 8.43, 9.12, 11.23, 11.83, 12.93, 14.30], [17,11,9,7,6,6,5,5]),
 "image adapter": ([0.956, 0.948, 0.992, 0.88, 0.928, 0.856, 0.904, 0.895], 35,
   [100.2, 85.8, 86.0, 88.5, 84.6, 90.7, 84.5, 78.7], [4.70, 5.92, 7.12, 9.15, 10.01, 11.00, 11.69, 12.96], [18,12,10,8,7,7,6,5]),
 "text-only": ([0.846, 0.86, 0.559, 0.823, 0.544, 0.79, 0.755, 0.905], 32,
   [111.9, 94.6, 90.6, 98.3, 104.3, 115.9, 124.5, 141.6], [4.84, 5.76, 6.43, 7.59, 8.71, 9.91, 10.97, 12.01], [20,13,12,11,10,10,10,10]),
}
for name, (a, L, call, r5, meas_rounds) in cases.items():
    best = min(range(8), key=lambda i: call[i]) + 1
    rate = max(range(1, 9), key=lambda g: (1 + sum(__import__('math').prod(a[:d]) for d in range(1, g + 1))) / r5[g - 1])
    ren = min(range(1, 9), key=lambda g: rounds(a, g, L) * r5[g - 1])
    exact = min(range(1, 9), key=lambda g: meas_rounds[g - 1] * r5[g - 1])
    print(f"{name}: best measured call {best}; rate model picks {rate}; renewal picks {ren}; measured rounds x round ms picks {exact}")
    print("   renewal rounds", [round(rounds(a, g, L), 2) for g in range(1, 9)], "measured", meas_rounds)
