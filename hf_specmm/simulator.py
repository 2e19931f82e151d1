"""The simulator (``hf-specmm auto-sim``, ``hf_specmm.auto.simulate``): ``Auto``'s own budget (:class:`~hf_specmm.auto.budget.AutoBudget`,
its acceptance and cost tables) driven on a virtual clock with no model, beside every fixed shape on the same
answers. Each round's time comes from a profile (docs/auto.md has its format), each row's accepted drafts are
drawn from the profile's acceptance, each answer's length from its range."""

from __future__ import annotations

import bisect
import json
import math
import random
from typing import Any, Sequence

from . import auto
from .auto.acceptance import AcceptanceTable, check_profile
from .auto.budget import AutoBudget
from .auto.costs import Table
from .auto.shapes import MAX_DEPTH, PLAIN, Shape, candidates
from .budget import RoundOutcome

FIRST_CALLS = 20  # the result's "first_20": figures over a fresh process's first calls
KEYS = {"verify_ms", "batch", "draft_ms", "overhead_ms", "cold", "noise", "drift", "draft_drift", "acceptance",
        "acceptance_drift", "answer_tokens", "source"}


def _bad(key: str, why: str) -> ValueError:
    return ValueError(f"profile key {key!r}: {why}")


def _ms(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _bad(key, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _curve(table: Any, key: str) -> list[tuple[int, float]]:
    if not isinstance(table, dict) or not table:
        raise _bad(key, "must be a non-empty object {\"<width>\": ms}")
    points = []
    for w, ms in table.items():
        if not str(w).isdigit() or int(w) < 1:
            raise _bad(key, f"width {w!r} must be an integer >= 1")
        points.append((int(w), _ms(ms, f"{key}.{w}")))
    return sorted(points)


def _acceptance(value: Any, key: str) -> list[list[float]]:
    if isinstance(value, dict):
        if "profile" not in value:  # what world-tau --profile writes: its other keys describe the measurement
            raise _bad(key, "as an object must hold a 'profile' list of depths")
        value = value["profile"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [[value]]
    try:
        check_profile(value, "acceptance")
    except ValueError as error:
        raise _bad(key, str(error)) from None
    return [[float(p) for p in row] for row in value]


def _changes(value: Any, key: str, read: Any) -> list[tuple[int, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == 2 for v in value):
        raise _bad(key, "must be a list of [call, value] pairs")
    out = []
    for call, v in value:
        if isinstance(call, bool) or not isinstance(call, int) or call < 0:
            raise _bad(key, f"call {call!r} must be an integer >= 0")
        out.append((call, read(v, key)))
    return sorted(out, key=lambda x: x[0])


def check_sim_profile(data: Any) -> dict[str, Any]:
    """A profile checked and normalised; a bad one raises ValueError naming the key."""
    if not isinstance(data, dict):
        raise ValueError("profile must be a JSON object (docs/auto.md: the profile format)")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise _bad(unknown[0], f"is not a profile key (known: {', '.join(sorted(KEYS))})")
    for key in ("verify_ms", "draft_ms", "acceptance"):
        if key not in data:
            raise _bad(key, "is missing")
    p: dict[str, Any] = {"verify": {1: _curve(data["verify_ms"], "verify_ms")}, "draft_scale": {1: 1.0}}
    for b, entry in (data.get("batch") or {}).items():
        if not str(b).isdigit() or int(b) < 1 or not isinstance(entry, dict) or "verify_ms" not in entry:
            raise _bad("batch", f"entry {b!r} must be {{\"<b>\": {{\"verify_ms\": {{...}}, \"draft_scale\": f}}}}")
        p["verify"][int(b)] = _curve(entry["verify_ms"], f"batch.{b}.verify_ms")
        p["draft_scale"][int(b)] = _ms(entry.get("draft_scale", 1.0), f"batch.{b}.draft_scale")
    draft = data["draft_ms"]
    if not isinstance(draft, dict) or not {"first", "step"} <= set(draft) or set(draft) - {"first", "step", "level"}:
        raise _bad("draft_ms", "must be {\"first\": ms, \"step\": ms, \"level\": {\"<top_k>\": ms}}")
    p["first"], p["step"] = _ms(draft["first"], "draft_ms.first"), _ms(draft["step"], "draft_ms.step")
    p["level"] = {k: ms for k, ms in _curve(draft.get("level") or {"1": draft["step"]}, "draft_ms.level")}
    over = data.get("overhead_ms", {})
    if not isinstance(over, dict) or set(over) - {"round", "call"}:
        raise _bad("overhead_ms", "must be {\"round\": ms, \"call\": ms}")
    p["round"], p["call"] = _ms(over.get("round", 0), "overhead_ms.round"), _ms(over.get("call", 0), "overhead_ms.call")
    cold = data.get("cold", {"factor": 1.0, "rounds": 0})
    if not isinstance(cold, dict) or set(cold) != {"factor", "rounds"} or not isinstance(cold["rounds"], int):
        raise _bad("cold", "must be {\"factor\": f, \"rounds\": n}")
    p["cold"] = (_ms(cold["factor"], "cold.factor"), _ms(cold["rounds"], "cold.rounds"))
    p["noise"] = _ms(data.get("noise", 0.0), "noise")
    p["drift"] = _changes(data.get("drift", []), "drift", _ms)
    p["draft_drift"] = _changes(data.get("draft_drift", []), "draft_drift", _ms)
    p["acceptance"] = [(0, _acceptance(data["acceptance"], "acceptance"))] + \
        _changes(data.get("acceptance_drift", []), "acceptance_drift", _acceptance)
    answer = data.get("answer_tokens", [64, 64])
    if not isinstance(answer, list) or len(answer) != 2 or not all(isinstance(x, int) and x >= 1 for x in answer) \
            or answer[0] > answer[1]:
        raise _bad("answer_tokens", f"must be [min, max] integers >= 1, got {answer!r}")
    p["answer"] = tuple(answer)
    return p


def _interp(points: list[tuple[int, float]], x: float) -> float:
    """Linear between given points, the last slope past the last (the first value before the first)."""
    xs = [q[0] for q in points]
    i = bisect.bisect_left(xs, x)
    if i < len(points) and xs[i] == x:
        return points[i][1]
    if i == 0 or len(points) == 1:
        return points[0][1] if i == 0 else points[-1][1]
    if i == len(points):  # past the widest: the last slope, never downward
        (x0, y0), (x1, y1) = points[-2], points[-1]
        return y1 + max(y1 - y0, 0.0) * (x - x1) / (x1 - x0)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _latest(changes: list[tuple[int, Any]], call: int, default: Any) -> Any:
    return next((v for c, v in reversed(changes) if c <= call), default)


def tree_nodes(p: Sequence[Sequence[float]], top_k: int, depth: int, nodes: int) -> list[tuple[int, int, float]]:
    """The tree ``(top_k, depth, nodes)`` as the EAGLE-2 expansion keeps it when each node is valued by its path's
    acceptance probability (Π p along its ranks): (parent index or −1, rank, value) per kept node, parents first.
    The sum of the values is E[accepted drafts] (Sequoia's objective under EAGLE-2's frontier rule)."""
    found: list[tuple[int, int, float]] = []  # every candidate: (parent, rank, value)
    frontier = [(-1, 1.0)]
    for d in range(depth):
        row = p[min(d, len(p) - 1)]
        level = []
        for parent, value in frontier:
            for r in range(top_k):
                level.append((parent, r, value * (row[r] if r < len(row) else row[-1])))
        start = len(found)
        found += level
        order = sorted(range(len(level)), key=lambda i: -level[i][2])[:top_k]
        frontier = [(start + i, level[i][2]) for i in order]
    keep = sorted(sorted(range(len(found)), key=lambda i: -found[i][2])[:nodes])  # ties: earlier first
    index = {old: new for new, old in enumerate(keep)}
    return [(index.get(found[i][0], -1), found[i][1], found[i][2]) for i in keep]


class Machine:
    """One simulated process: the profile's clock, cold widths and random draws."""

    def __init__(self, p: dict[str, Any], seed: int):
        self.p, self.rng, self.seen = p, random.Random(seed), {}
        self.now, self.call = 0.0, 0
        self.trees: dict[tuple, Any] = {}
        self.base: dict[tuple, float] = {}  # a round's ms before cold, noise and drift

    def _batch(self, table: dict[int, Any], rows: int, f: Any) -> float:
        sizes = sorted(table)
        below = max([b for b in sizes if b <= rows], default=sizes[0])
        above = min([b for b in sizes if b >= rows], default=sizes[-1])
        lo, hi = f(table[below]), f(table[above])
        return lo if above == below else lo + (hi - lo) * (rows - below) / (above - below)

    def seconds(self, shape: Shape, rows: int, in_loop: bool = True) -> float:
        p, key = self.p, (shape, rows, in_loop, _latest(self.p["draft_drift"], self.call, 1.0))
        if key not in self.base:
            verify = self._batch(p["verify"], rows, lambda c: _interp(c, shape.width))
            draft = 0.0
            if shape.gamma:
                level = p["step"] if shape.tree is None else _interp(list(p["level"].items()), shape.tree.top_k)
                draft = (p["first"] + (shape.gamma - 1) * level) * self._batch(p["draft_scale"], rows, lambda s: s)
            self.base[key] = verify + draft * key[3] + (p["round"] if in_loop else 0.0)
        factor, n = p["cold"]
        seen = self.seen.get(shape.width, 0)
        self.seen[shape.width] = seen + 1
        ms = self.base[key] * (factor if seen < n else 1.0)
        if p["noise"] and in_loop:
            ms *= math.exp(self.rng.gauss(0.0, p["noise"]) - p["noise"] ** 2 / 2)
        return ms * _latest(p["drift"], self.call, 1.0) / 1e3

    def accepted(self, shape: Shape, acc: list[list[float]]) -> tuple[int, list[tuple[int, int]]]:
        """A row's accepted drafts and its path nodes (children, rank taken; rank −1: none)."""
        rng, path = self.rng, []
        if shape.tree is None:
            n = 0
            while n < shape.gamma and rng.random() < acc[min(n, len(acc) - 1)][0]:
                n += 1
            return n, [(1, 0)] * n + ([(1, -1)] if n < shape.gamma else [])
        key = (shape.tree, id(acc))
        if key not in self.trees:  # each node's children by rank: {rank: (child, position among its siblings)}
            nodes = tree_nodes(acc, shape.tree.top_k, shape.tree.depth, shape.tree.nodes)
            children: dict[int, dict[int, int]] = {}
            for i, (parent, rank, _) in enumerate(nodes):
                children.setdefault(parent, {})[rank] = i
            self.trees[key] = {a: {r: (i, pos) for pos, (r, i) in enumerate(sorted(kids.items()))}
                               for a, kids in children.items()}
        children = self.trees[key]
        at, depth = -1, 0
        while at in children:
            kids = children[at]
            row, u, r = acc[min(depth, len(acc) - 1)], rng.random(), 0
            while r < len(row) and u >= row[r]:
                u -= row[r]
                r += 1
            nxt = kids.get(r) if r < len(row) else None  # past the listed ranks: the target took none of them
            path.append((len(kids), -1 if nxt is None else nxt[1]))
            if nxt is None:
                break
            at, depth = nxt[0], depth + 1
        return depth, path


def run_call(m: Machine, lengths: list[int], budget: AutoBudget | None, fixed: Shape | None) -> tuple[int, float]:
    """One call's (tokens, seconds): ``budget`` chooses (Auto), else every round takes ``fixed`` (PLAIN: the
    call runs as plain generate)."""
    start, p, top = m.now, m.p, max(lengths)
    acc = _latest(p["acceptance"], m.call, None)
    m.now += p["call"] / 1e3
    done, live = [1] * len(lengths), [n > 1 for n in lengths]
    plain_call = fixed == PLAIN or (budget is not None and budget.runs_plain())
    steps = 1
    # as the loop: the first round's budget once, then one close per round, which returns the next round's
    plan = budget.start([top - d for d in done], live) if budget is not None and not plain_call else None
    while any(live):
        remaining = [top - d for d in done]
        rows = sum(live)
        if plain_call:
            m.now += m.seconds(PLAIN, rows, in_loop=False)
            steps += 1
            done = [d + 1 if u else d for d, u in zip(done, live)]
            live = [u and d < n for u, d, n in zip(live, done, lengths)]
            continue
        room = max(r for r, u in zip(remaining, live) if u) - 1
        if plan is not None:
            shape = Shape(plan.gamma, plan.tree)
        else:
            shape = fixed.fit(room)  # type: ignore[union-attr]
        m.now += m.seconds(shape, rows)
        kept, accepted, drafted, ended, paths = [], [], [], [], []
        for i, u in enumerate(live):
            if not u:
                kept.append(0), accepted.append(0), drafted.append(0), ended.append(False), paths.append([])
                continue
            n, path = m.accepted(shape, acc) if shape.gamma else (0, [])
            k = min(n + 1, lengths[i] - done[i])
            done[i] += k
            kept.append(k), accepted.append(n), drafted.append(shape.gamma), paths.append(path)
            ended.append(done[i] >= lengths[i] and lengths[i] < top)
        started, live = live, [u and d < n for u, d, n in zip(live, done, lengths)]
        if budget is not None:
            trees = (lambda paths=paths: [[(c, max(r, 0)) for c, r in q] for q in paths]) if shape.tree else None
            plan = budget.close(RoundOutcome(shape.gamma, started, kept, accepted, drafted, ended,
                                             [top - d for d in done], live, trees))
    if budget is not None:
        if plain_call:
            budget.close_plain_call(steps, len(lengths))
        budget.report()
    return sum(lengths), m.now - start


def simulate(profile: dict[str, Any] | str, calls: int = 400, batch: int = 1, seed: int = 0, skip: int = 0,
             max_tokens: int = 64, max_depth: int = 8) -> dict[str, Any]:
    """Auto and every fixed shape of its grid (plain: whole calls of plain generate) on the same answers; figures
    over the calls after the first ``skip``. ``profile``: a dict or a JSON file's path."""
    if isinstance(profile, str):
        with open(profile) as f:
            profile = json.load(f)
    p = check_sim_profile(profile)
    for name, value, low, high in (("calls", calls, 1, None), ("batch", batch, 1, None), ("skip", skip, 0, calls - 1),
                                   ("max_depth", max_depth, 1, MAX_DEPTH), ("max_tokens", max_tokens, 1, None)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise ValueError(f"{name} must be an integer in [{low}, {high if high is not None else '∞'}], got {value!r}")
    draw = random.Random(seed)
    answers = [[draw.randint(*p["answer"]) for _ in range(batch)] for _ in range(calls)]
    grid = list(candidates(max_tokens, max_depth))
    acceptance, tables = AcceptanceTable(depth=MAX_DEPTH, ranks=8), {}  # a fresh process: no prior, no costs

    def table(rows: int) -> tuple[str, Table]:
        key = f"batch<={1 << max(rows - 1, 0).bit_length()}"
        return key, tables.setdefault(key, Table())

    results: dict[str, list[tuple[int, float]]] = {}
    taken: list[str] = []
    for strategy in ["auto"] + [s.label for s in grid]:
        m, out = Machine(p, seed * 7919 + len(results)), []
        fixed = next((s for s in grid if s.label == strategy), None)
        for c, lengths in enumerate(answers):
            m.call = c
            budget = AutoBudget(grid, acceptance, table, batch, clock=lambda: m.now) if fixed is None else None
            out.append(run_call(m, lengths, budget, fixed))
            if budget is not None:
                shapes = [e[0] for e in budget.log] or ["plain generate"]
                taken.append(max(dict.fromkeys(shapes), key=shapes.count))  # a tie: the first taken
        results[strategy] = out

    def rate(rows: list[tuple[int, float]]) -> float:
        return sum(t for t, _ in rows) / sum(s for _, s in rows)

    def figures(first: int, last: int) -> dict[str, Any]:
        fixed = {k: rate(v[first:last]) for k, v in results.items() if k != "auto"}
        best, auto = max(fixed, key=fixed.get), rate(results["auto"][first:last])  # type: ignore[arg-type]
        return {"auto_tokens_per_s": auto, "fixed": fixed, "best_shape": best, "auto_over_best": auto / fixed[best],
                "auto_over_plain": auto / fixed["plain"], "best_tokens_per_s": fixed[best]}

    first = figures(0, FIRST_CALLS)  # a fresh process's first calls, as a user meets them
    first.pop("fixed")
    return {**figures(skip, calls), "calls": calls, "batch": batch, "seed": seed, "skip": skip,
            "auto_shapes_by_call": taken, f"first_{FIRST_CALLS}": first}


auto.simulate, auto.check_sim_profile = simulate, check_sim_profile  # hf_specmm.auto.simulate (see hf_specmm.auto)
