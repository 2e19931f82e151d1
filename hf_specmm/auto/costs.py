"""The measured costs: a round's verification time by block width and its drafting time by shape, per
(target, draft, device, dtype, batch bucket, cache kind), kept for the process and optionally in a JSON file
(:mod:`hf_specmm.auto.store`).

Costs are timed on the real rounds as they run (no extra forward, so nothing can change an output): the
draft phase from the round's start to the end of ``propose`` (one device synchronisation there on an
accelerator; the round's end is already synchronised by the loop, which reads the kept counts on the host),
the rest of the round (verification forward, acceptance, rollback, bookkeeping) from then to the next
round's start. Each (kind, width) and each drafted shape keeps its last :data:`SAMPLES` timings; a shape's
cost is their median, so one slow outlier (a first call at a new width, a clock hiccup) does not steer it.

Predictions are made from a smoothed curve, not from each shape's own timings: per width, the median of its
samples; over widths, the isotonic (non-decreasing) least-squares fit of those medians weighted by their sample
counts (costs do not shrink with width, so a non-monotone pair of medians is noise and is pooled); between and
beyond the fitted points, linear interpolation. So a few calibration widths predict every shape, and a noisy
sample at one width is averaged with its neighbours' instead of steering the choice. The verification time is
such a curve in the block width (chain blocks and tree blocks separately: a tree's mask and path bookkeeping
cost more), a tree's drafting time a chain of 1 (the pending read and the root) plus (depth - 1) levels whose
cost is one in their width top_k. A chain's drafting time is a line in γ (:func:`line`: each step is one forward
of the same draft), fitted to every γ's median at once: per-γ medians of nine rounds 20-30 % apart put chains
5 and 6 at the same cost on the shipped world, where their rounds took 19.3 and 22.0 ms.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from typing import Any

SAMPLES = 9  # timings per key (curve points are fixed once they have these; stock steps: the recent ones)
KIND_SAMPLES = 64  # relative round-time ratios kept per kind (chain, tree), see :meth:`CostTable.time_factor`
RATIO_STRENGTH = 4.0  # pseudo-rounds pulling a kind's relative factor toward 1
SPEED_WEIGHT = 0.2  # how far one round moves the machine's speed index (fast: curves are fixed, see add)
PAIR_CALLS = 3  # the speculative calls' recent ones a plain generate call is compared with (see CostTable._pair)
#: calls whose lengths (longest rows' tokens) the whole calls' choice weighs (see :meth:`CostTable.stock_share`)
LENGTH_CALLS = 64
CALIBRATION_SAMPLES = 3  # timings per calibration shape before the policy chooses (curve points are fixed: a median of 3
# is robust to one slow round, one of 2 is not)


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def interpolate(points: dict[int, float], x: float) -> float | None:
    """Piecewise-linear through ``points`` (x → y, keys in increasing order or not); linear extrapolation from
    the two nearest points outside them, never below the nearest point's value when it would fall (costs do not
    shrink with width)."""
    if not points:
        return None
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    if x <= xs[0]:
        a, b = xs[0], xs[1]
    elif x >= xs[-1]:
        a, b = xs[-2], xs[-1]
    else:
        i = bisect.bisect_left(xs, x)
        a, b = xs[i - 1], xs[i]
    slope = (points[b] - points[a]) / (b - a)
    y = points[a] + slope * (x - a)
    if x > xs[-1]:
        y = max(y, points[xs[-1]])
    if x < xs[0]:
        y = min(y, points[xs[0]])
    return max(y, 0.0)


class CostTable:
    """Timings of one (target, draft, device, dtype, batch bucket, cache kind): ``verify[kind][width]`` and
    ``draft[label]`` (labels ``chain:γ`` and ``tree:K,D``), each a list of recent seconds."""

    def __init__(self, data: dict[str, Any] | None = None):
        data = data or {}
        self.verify: dict[str, dict[int, list[float]]] = {
            kind: {int(w): list(v) for w, v in data.get("verify", {}).get(kind, {}).items()} for kind in ("chain", "tree")}
        self.draft: dict[str, list[float]] = {k: list(v) for k, v in data.get("draft", {}).items()}
        self.stock: list[float] = list(data.get("stock", []))  # plain generate's own decoding steps
        #: per speculative call, its longest row's tokens per second of its chosen rounds and the seconds it spent
        #: outside its rounds (set-up, the target's and the draft's prefills); per call run as plain generate, its
        #: seconds outside its decoding steps and its mean step; per call of either, its longest row's tokens
        self.rates: list[float] = list(data.get("rates", []))
        #: per rate, its call's longest row's tokens (the rates' weights in a pair: :meth:`_pair`)
        self.rate_tokens: list[float] = list(data.get("rate_tokens", [1.0] * len(self.rates)))
        self.overheads: list[float] = list(data.get("overheads", []))
        self.lengths: list[float] = list(data.get("lengths", []))
        self.stock_calls: list[list[float]] = [list(c) for c in data.get("stock_calls", [])]
        self.round_seconds: list[float] = list(data.get("round_seconds", []))  # per speculative call: mean round
        #: plain generate's call beside the speculative calls next to it in time: [its overhead, its step, their
        #: overhead, rate and mean round] (see :meth:`stock_share`); which kind the last call was
        self.pairs: list[list[float]] = [list(p) for p in data.get("pairs", [])]
        self.last_call: str | None = None
        self.paired = 0  # pairs made so far (pairs keeps the recent ones)
        self.spec_run = 0  # speculative calls with a rate since plain generate's last call
        #: per kind: recent relative ratios (round seconds measured / predicted by the curves, over the speed index
        #: of the moment), and the speed index itself; see :meth:`time_factor`
        self.kind_ratios: dict[str, list[float]] = {k: list(v) for k, v in data.get("kind_ratios", {}).items()}
        self.speed = float(data.get("speed", 1.0))
        self.last_kind: str | None = None  # the kind of the last round observe_ratio saw
        self.version = 0  # bumped by every round timed (a ranking made at one version holds until the next)
        self.seen: set[str] = set()  # shapes whose first round in this table has passed (see :meth:`first_round`)

    def to_json(self) -> dict[str, Any]:
        return {"verify": {kind: {str(w): v for w, v in widths.items()} for kind, widths in self.verify.items()},
                "draft": dict(self.draft), "stock": list(self.stock), "rates": list(self.rates),
                "rate_tokens": list(self.rate_tokens),
                "overheads": list(self.overheads), "lengths": list(self.lengths),
                "stock_calls": [list(c) for c in self.stock_calls], "round_seconds": list(self.round_seconds),
                "pairs": [list(p) for p in self.pairs], "kind_ratios": dict(self.kind_ratios), "speed": self.speed}

    def add_stock_step(self, seconds: float) -> None:
        _push(self.stock, seconds)

    def stock_step_time(self) -> float | None:
        """Seconds of one step of plain generate's own loop (None: never measured)."""
        return _median(self.stock) if self.stock else None

    def add_call(self, tokens_per_s: float | None, round_s: float | None, overhead_s: float, tokens: int) -> None:
        """A speculative call (no calibration round in it): its longest row's tokens per second of its chosen
        rounds (AutoBudget._time_call) and their mean seconds (None: too few of them), its seconds outside its
        rounds and its longest row's tokens."""
        _push(self.overheads, overhead_s)
        _push(self.lengths, float(tokens), LENGTH_CALLS)
        if tokens_per_s is None or round_s is None:
            return
        _push(self.rates, tokens_per_s)
        _push(self.rate_tokens, float(max(tokens, 1)))
        _push(self.round_seconds, round_s)
        self.spec_run += 1
        if self.last_call == "plain":
            self._pair()
        self.last_call = "spec"

    def add_stock_call(self, overhead_s: float, step_s: float, tokens: int) -> None:
        """A call run as plain generate: its seconds outside its decoding steps, its mean step, its longest row's
        tokens (its decoding steps)."""
        _push(self.stock_calls, [overhead_s, step_s])
        _push(self.lengths, float(tokens), LENGTH_CALLS)
        if self.last_call == "spec":
            self._pair()
        self.last_call, self.spec_run = "plain", 0

    def _pair(self) -> None:
        """Plain generate's last call beside the recent speculative calls: next to each other in time, so the
        machine's speed of the moment is in both. The speculative side: the run of speculative calls next to plain
        generate's call, its last :data:`PAIR_CALLS` at most. Where calls run as plain generate, that run is the
        one call made at the gap; the last 3 speculative calls were then 8-64 calls apart, and two of them from a
        slow spell outvoted the one beside plain generate (the median over pairs, :meth:`stock_share`, pools the
        noise of one call). Their rate is pooled, their tokens over their seconds (each call's tokens at its own
        rate), not their median: a call's time goes with one over its rate, and the prompts' rates spread (on the
        shipped world at batch 1 the text-only draft's 450-810 tokens/s): the median rate priced the workload's
        speculative calls 4 % fast there, and 9 pairs' median share spread 0.049 about the truth (0.91, plain
        generate faster), 0.030 pooled; in 2 of 4 processes of session 24 its calls ran speculative, at 0.88-0.90x
        plain (benchmarks/results/auto/session24/mix)."""
        overhead, step = self.stock_calls[-1]
        calls = min(max(self.spec_run, 1), PAIR_CALLS)
        tokens, rates = self.rate_tokens[-calls:], self.rates[-calls:]
        rate = sum(tokens) / sum(n / r for n, r in zip(tokens, rates))
        _push(self.pairs, [overhead, step, _median(self.overheads[-calls:]), rate,
                           _median(self.round_seconds[-calls:])])
        self.paired += 1

    def stock_share(self) -> float | None:
        """Plain generate's time over the speculative loop's for the last :data:`LENGTH_CALLS` calls' lengths (their
        longest rows' tokens, calls of either kind), the median over the recent pairs of calls next to each other in
        time (:meth:`_pair`; None before the first pair): plain generate, its overhead (set-up, the prefill) plus a step
        per token; the speculative loop, its overhead (set-up, the target's and the draft's prefills) plus the
        tokens at its rounds' realised rate, at least one round (an answer of one token takes a whole round).

        Whole calls, not rounds: on tiny models at batch 4 a chain's rounds realised more tokens per second than
        plain generate's steps while its calls ran at 0.78x plain. Rates and lengths apart, not the calls' times:
        a speculative call that runs every 8th..64th call draws the same prompt each time where the prompts
        cycle. Pairs, not each kind's recent calls: plain generate's side rested on calls minutes older than the
        speculative side's, and a slow spell on one side only flipped the choice (on the shipped world the
        EAGLE-3 head's share fell from 1.3 to 0.98 with plain generate's step measured once, and its calls ran
        as plain generate at 0.85x its chain's speed). The workload's mix of lengths, not the last few calls': a
        call's length is unknown when it starts, and weighing the last 9 the choice followed the shipped world's task
        blocks at batch 1 a few calls late (after a block of 1-token answers, the long answers after it ran as plain
        generate at 1.2-1.45x their chain's time: the image adapter's Auto 1.05x its chain 4, 1.03x so)."""
        if not self.pairs or not self.lengths:
            return None
        sums = self._length_sums()
        return _median([self.pair_share(p, sums) for p in self.pairs])

    def pair_share(self, pair: list[float], sums: tuple[list[float], list[float]] | None = None) -> float:
        """One pair's plain generate time over the speculative loop's for the recent calls' lengths (see
        :meth:`stock_share`; ``sums``: :meth:`_length_sums`, made once for every pair)."""
        plain_overhead, step, overhead, rate, round_s = pair
        order, below = sums or self._length_sums()
        calls, tokens = len(order), below[-1]
        plain = calls * plain_overhead + step * tokens
        # Σ max(n / rate, round_s): the calls of fewer than rate · round_s tokens take one round (closed form, not a
        # sum per pair: 64 lengths times 9 pairs were 0.2 ms of each call's start at batch 1 on the shipped world)
        short = bisect.bisect_left(order, rate * round_s)
        return plain / (calls * overhead + short * round_s + (tokens - below[short]) / rate)

    def _length_sums(self) -> tuple[list[float], list[float]]:
        """The recent calls' lengths in increasing order and their running sums (``below[i]``: the i shortest)."""
        order = sorted(self.lengths)
        return order, [0.0, *itertools.accumulate(order)]

    # ---- timings ---------------------------------------------------------------------------------------
    def add(self, kind: str, width: int, draft_label: str | None, draft_s: float, verify_s: float) -> None:
        """One round: ``kind`` 'chain' (a plain step is the chain of width 1) or 'tree', its block ``width``,
        its drafted shape's label (None for a plain step) and the two phases' seconds, kept at the machine's usual
        speed (divided by the speed index; predictions are multiplied by it again in :meth:`time_factor`) until a
        key has :data:`SAMPLES` timings: then its curve point is fixed, and what its shapes' rounds realise after
        that goes to the speed index and their relative factors. Only the widths being taken are timed: curves
        that kept taking in new raw timings put the speed of the minute they were timed in into those widths
        only, and the widths not taken (the other kind's) looked that much cheaper or dearer for as long as
        nothing took them (one explored round in a median of nine moves nothing). Simulated
        (``benchmarks/auto_cost_drift.py``: a chain taken, a tree explored, per-round noise and a drifting speed),
        the predicted ratio of the two was off by 11-28 % on average and 3.6x at worst that way; with fixed
        points and factors learned from contrasts (:meth:`observe_ratio`) by 5 %, 1.25x at worst."""
        self.version += 1
        self._fill(self.verify[kind].setdefault(width, []), verify_s)
        if draft_label is not None:
            self._fill(self.draft.setdefault(draft_label, []), draft_s)

    def _fill(self, values: list[float], seconds: float) -> None:
        if len(values) < SAMPLES:  # a filled curve point stays as it is
            values.append(seconds / self.speed)

    def first_round(self, label: str, kind: str, width: int, draft_label: str | None) -> bool:
        """Whether this is shape ``label``'s first round in this table, with nothing timed yet at its width and
        drafted shape (then the round is not recorded). A first round at a new block width pays one-time costs
        (the CPU kernels' primitives for new shapes, first allocations). Kept, it stayed in the calibration
        shapes' medians (two timings each) for as long as no later round took them, and the curves every other
        shape is read from were up to 2x slow (on the world it then took trees where chain 5 ran 1.3x faster)."""
        first = not self.recorded(label, kind, width, draft_label)
        self.seen.add(label)
        return first

    def recorded(self, label: str, kind: str, width: int, draft_label: str | None) -> bool:
        """Whether a round of shape ``label`` would be recorded now (not a first round: :meth:`first_round`)."""
        return label in self.seen or self.samples(kind, width, draft_label) > 0

    def observe_ratio(self, kind: str, predicted_s: float, measured_s: float) -> None:
        """A round of a ``kind`` ('chain': plain steps included, or 'tree') took ``measured_s`` where the curves
        predicted ``predicted_s``: its ratio is the machine's speed of the moment times the kind's own factor.

        Which of the two moved is known only from a contrast: a round of the other kind than the round before
        (an explored shape, a switch) is read against the speed index the rounds before it left, and sets its
        kind's relative factor; a round of the same kind as before moves the speed index only. Learning both
        from the same rounds split every change of the taken shape's time between the two at random, and a
        slow spell timed on the taken kind made the other look faster by part of it."""
        ratio = min(max(measured_s / predicted_s, 0.25), 4.0)  # one stalled round moves a factor, never owns it
        if kind != self.last_kind:
            values = self.kind_ratios.setdefault(kind, [])
            values.append(ratio / self.speed)
            del values[:-KIND_SAMPLES]
            self.last_kind = kind
        self.speed += SPEED_WEIGHT * (ratio / self.relative_factor(kind) - self.speed)

    def contrasts(self, kind: str) -> int:
        """Samples of a kind's own factor (its contrast rounds, the recent ones)."""
        return len(self.kind_ratios.get(kind, ()))

    def relative_factor(self, kind: str) -> float:
        """A kind's realised round time over the curves' prediction, at the machine's usual speed: the mean of its
        recent relative ratios, shrunk (:data:`RATIO_STRENGTH`) toward 1. The curves are fitted to the round's two
        phases; a round's mean time is what tokens per second divides by, and a tree's work outside the fitted
        parts (its masks and paths) shows in its rounds only. Per kind, not per shape: chains of one draft
        differ by what the curves have (width, steps); per shape, each factor rested on the few rounds
        exploration gave it and moved by 10-20 % between runs (on the shipped world chain 6 was predicted 16.7
        ms per round where its rounds took 22.0, and Auto took chain 8 at 1.16x chain 5's wall time)."""
        own = self.kind_ratios.get(kind, [])
        return (sum(own) + RATIO_STRENGTH) / (len(own) + RATIO_STRENGTH)

    def time_factor(self, kind: str) -> float:
        """Realised over predicted round time of a ``kind``'s shapes now: the machine's speed index times the
        kind's :meth:`relative_factor`. Each round's ratio is read as speed × the kind's factor: the speed index
        (a moving average of what the rounds imply, :data:`SPEED_WEIGHT`) follows the machine, and a kind's
        factor is kept apart from the moment it was timed at. On shared cores the speed drifts by up to 1.5x
        within a minute, and a kind is timed only by the rounds that take it: raw ratios of the taken kind
        (fresh) against those of the other (old) would compare moments, not kinds."""
        return self.speed * self.relative_factor(kind)

    def samples(self, kind: str, width: int, draft_label: str | None) -> int:
        n = len(self.verify[kind].get(width, []))
        return n if draft_label is None else min(n, len(self.draft.get(draft_label, [])))

    # ---- predictions -----------------------------------------------------------------------------------
    def model(self) -> "CostModel":
        """The medians as they are now, ready for many predictions (a policy ranks every candidate with one)."""
        return CostModel(self)

    def verify_time(self, kind: str, width: int) -> float | None:
        return self.model().verify_time(kind, width)

    def chain_draft_time(self, gamma: int) -> float | None:
        return self.model().chain_draft_time(gamma)

    def tree_draft_time(self, top_k: int, depth: int) -> float | None:
        return self.model().tree_draft_time(top_k, depth)


def isotonic(points: dict[int, list[float]]) -> dict[int, float]:
    """The non-decreasing fit of each x's median (weighted by its sample count), by pooling adjacent violators:
    what :func:`interpolate` predicts from (see the module)."""
    blocks: list[list[float]] = []  # [value, weight, first x index, last x index]
    xs = sorted(x for x in points if points[x])
    for i, x in enumerate(xs):
        blocks.append([_median(points[x]), float(len(points[x])), i, i])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v1, w1, a, _), (v2, w2, _, b) = blocks[-2], blocks.pop()
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, a, b]
    return {xs[i]: v for v, _, a, b in blocks for i in range(a, b + 1)}


def line(points: dict[int, list[float]]) -> dict[int, float]:
    """The weighted least-squares line through each x's median (weighted by its sample count), non-decreasing,
    read at those x: a chain's drafting time, whose every step is one forward of the same draft.

    >>> line({1: [3.0], 2: [5.0, 5.0], 4: [9.0, 9.0, 9.0]})
    {1: 3.0, 2: 5.0, 4: 9.0}
    >>> line({2: [6.0], 4: [4.0]})  # falling medians are noise: their weighted mean
    {2: 5.0, 4: 5.0}
    """
    xs = sorted(x for x in points if points[x])
    if not xs:
        return {}
    w = [float(len(points[x])) for x in xs]
    y = [_median(points[x]) for x in xs]
    total = sum(w)
    mx, my = sum(wi * x for wi, x in zip(w, xs)) / total, sum(wi * yi for wi, yi in zip(w, y)) / total
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    slope = max(sum(wi * (x - mx) * (yi - my) for wi, x, yi in zip(w, xs, y)) / sxx, 0.0) if sxx > 0 else 0.0
    return {x: max(my + slope * (x - mx), 0.0) for x in xs}


class CostModel:
    """Predicted seconds from a :class:`CostTable`'s fitted curves (see the module): built once per ranking."""

    def __init__(self, table: CostTable):
        self.verify = {kind: isotonic(widths) for kind, widths in table.verify.items()}
        if not self.verify["tree"]:  # no tree timed: its width's chain time (a lower bound)
            self.verify["tree"] = dict(self.verify["chain"])
        self.chain = line({int(k.split(":")[1]): v for k, v in table.draft.items() if k.startswith("chain:")})
        self.base = interpolate(self.chain, 1)
        per_level: dict[int, list[float]] = {}
        for label, values in table.draft.items():
            if label.startswith("tree:") and values and self.base is not None:
                k, d = map(int, label.split(":")[1].split(","))
                per_level.setdefault(k, []).extend(max(v - self.base, 0.0) / max(d - 1, 1) for v in values)
        self.level = isotonic(per_level)
        self.memo: dict[tuple, float | None] = {}

    def verify_time(self, kind: str, width: int) -> float | None:
        key = (kind, width)
        if key not in self.memo:
            self.memo[key] = interpolate(self.verify[kind], width)
        return self.memo[key]

    def chain_draft_time(self, gamma: int) -> float | None:
        key = ("chain draft", gamma)  # not ("chain", width): the verification's key
        if key not in self.memo:
            self.memo[key] = interpolate(self.chain, gamma)
        return self.memo[key]

    def tree_draft_time(self, top_k: int, depth: int) -> float | None:
        key = ("tree", top_k, depth)
        if key not in self.memo:
            self.memo[key] = self._tree_draft_time(top_k, depth)
        return self.memo[key]

    def _tree_draft_time(self, top_k: int, depth: int) -> float | None:
        if self.base is None:
            return None
        key = ("level", top_k)  # one per top_k, read by every depth's tree
        if key not in self.memo:
            level = interpolate(self.level, top_k)
            if level is None:  # no tree timed yet: a level of K nodes costs at least a chain step
                two = interpolate(self.chain, 2)
                level = 0.0 if two is None else max(two - self.base, 0.0)
            self.memo[key] = level
        return self.base + (depth - 1) * self.memo[key]


def _push(values: list[Any], x: Any, keep: int = SAMPLES) -> None:
    values.append(x)
    del values[:-keep]
