"""``AutoBudget``: one ``generate`` call's draft budget with ``hf_specmm.Auto``, the one decision rule. Every shape
(plain step, chain, tree) and both kinds of whole call are arms; an arm's rate (tokens per second) is its expected
tokens over its round time (:class:`~hf_specmm.auto.costs.Table`); the arm taken has the highest optimistic rate
``rate · (1 + EXPLORE / √(1 + n))``, n its discounted rounds of evidence (UCB), so it is explored while its estimate
is within its uncertainty of the best, and again once its evidence has faded."""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from ..budget import DraftBudget, RoundBudget, RoundOutcome
from .acceptance import AcceptanceTable, chain_lengths, tree_lengths
from .costs import Table
from .shapes import PLAIN, Shape

#: the optimism of an arm without evidence: its rate may be this much above its estimate
EXPLORE = 0.1
#: rounds between two computations of the shapes' expected tokens from the acceptance table (it moves slowly)
REFRESH = 16


def expected_tokens(acceptance: AcceptanceTable, shapes: list[Shape], fresh: bool = False) -> dict[Shape, float]:
    """1 + E[accepted drafts] per row of each shape under the acceptance table, cached on the table for
    :data:`REFRESH` of its rounds (``fresh``: until it observes another)."""
    cached = getattr(acceptance, "_expected", None)
    if cached is not None and acceptance.rounds - cached[0] < (1 if fresh else REFRESH) \
            and (cached[2] is shapes or all(s in cached[1] for s in shapes)):
        return cached[1]
    depth = max(max((s.gamma for s in shapes), default=1), 1)
    p = acceptance.cut_by_ends(depth)
    chains = [0.0] + chain_lengths(p, depth)
    widest = max(s.width for s in shapes) - 1
    trees = {k: tree_lengths(p, k, depth, widest) for k in {s.tree.top_k for s in shapes if s.tree is not None}}
    out = {s: 1.0 + (chains[s.gamma] if s.tree is None else trees[s.tree.top_k][s.tree.depth - 1][s.tree.nodes - 1])
           for s in shapes}  # one expansion per top_k serves every tree of it
    acceptance._expected = (acceptance.rounds, out, shapes)  # type: ignore[attr-defined]
    return out


def shape_tokens(p: list[list[float]], shape: Shape) -> float:
    """1 + E[accepted drafts] per row of ``shape`` under the probabilities ``p[d][r]``."""
    if shape.tree is not None:
        return 1.0 + tree_lengths(p, shape.tree.top_k, shape.tree.depth, shape.tree.nodes)[-1][-1]
    return 1.0 + (chain_lengths(p, shape.gamma)[-1] if shape.gamma else 0.0)


def optimistic(rate: float, n: float) -> float:
    """An arm's score: its rate raised by its uncertainty, ``n`` its rounds of evidence."""
    return rate * (1.0 + EXPLORE / math.sqrt(1.0 + n))


class AutoBudget(DraftBudget):
    """Chooses each round's shape among ``shapes`` (or takes ``fixed`` shapes in turn), learns acceptance from
    every round and costs from every timed round; ``tables(rows)`` gives (key, table) of a round's live rows."""

    def __init__(self, shapes: list[Shape], acceptance: AcceptanceTable, tables: Callable[[int], tuple[str, Table]],
                 batch: int, fixed: list[Shape] | None = None, save: Callable[[list[str]], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(gamma=max(s.gamma for s in (fixed or shapes)))
        self.shapes, self.fixed, self.acceptance, self.tables = shapes, fixed, acceptance, tables
        self.clock, self.save, self.batch = clock, save, batch
        self.key, self.table = tables(batch)
        self.base = tables(1)[1] if batch > 1 else None  # its costs' prior: one row's (Table.model)
        self.used = {self.key}
        self.open: dict[str, Any] | None = None
        self.log: list[tuple[str, int, float, float, float | None]] = []  # shape, rows, tokens, seconds, predicted
        self.plain_call: tuple[int, int] | None = None  # (steps, rows) once the call ran as plain generate
        self.kept = [0] * batch  # each row's tokens kept so far
        self.whole_call: dict[str, Any] | None = None
        self.created = clock()

    def scores(self, table: Table, rows: int, shapes: list[Shape]) -> list[tuple[float, float, Shape, float]]:
        """(rate, optimistic rate, shape, rounds of evidence) of every shape in ``table`` for ``rows`` live rows."""
        theta = table.model(self.base if table is self.table else self.table)
        rates = table.rates(shapes, rows, expected_tokens(self.acceptance, self.shapes), theta)  # one cache: the grid's
        return [(r, optimistic(r, n), s, n) for (r, n), s in zip(rates, shapes)]

    def runs_plain(self) -> bool:
        """Whole calls are arms too: plain ``generate`` at its recent calls' tokens per second (its calls as evidence;
        tokens as it runs them: every row to the longest one's end), against a speculative call predicted from its
        parts: the mean call's tokens (of either kind: the workload's, not the few speculative calls'), as many per
        live row as the speculative calls' rounds made, at the best drafted shape's rate, plus the speculative calls'
        mean seconds outside their rounds (that shape's rounds as evidence)."""
        if self.fixed is not None or not self.shapes or self.shapes[0] != PLAIN:
            return False
        tokens, seconds, _, n_plain = self.table.call_rate("plain")
        spec_tokens, outside, row_tokens, n_calls = self.table.call_rate("speculative")
        expected_tokens(self.acceptance, self.shapes, fresh=True)  # plain calls add no rounds: not a stale cache
        drafted = self.scores(self.table, self.batch, [s for s in self.shapes if s.gamma])
        rate, _, shape, n_spec = max(drafted, key=lambda x: x[0])
        plain = tokens / seconds if seconds > 0 else 0.0
        mean = (tokens * n_plain + spec_tokens * n_calls) / (n_plain + n_calls) if n_calls else 0.0  # either kind's
        in_rounds = row_tokens / spec_tokens if spec_tokens > 0 else 1.0  # a call's tokens its rounds make per live row
        spec = mean / (outside + mean * in_rounds / rate) if n_calls else rate
        # each kind runs once before the rule decides, the speculative first (stock's loop is no round's plain step)
        ran = n_calls > 0 or "speculative" in self.table.called
        chosen = ran and (n_plain == 0 or optimistic(plain, n_plain) > optimistic(spec, n_spec))
        self.whole_call = {"plain_generate": chosen, "plain_rate": plain, "speculative_rate": spec,
                           "speculative_shape": shape.label}
        return chosen

    def plan(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget:
        now = self.clock()
        self._time_round(now)
        rows = sum(unfinished)
        room = max(r for r, u in zip(remaining, unfinished) if u) - 1
        key, table = self.tables(rows)
        self.used.add(key)
        predicted = None
        if self.fixed is not None:
            choice = self.fixed[len(self.log) % len(self.fixed)]
        else:
            rate, _, choice, _ = max(self.scores(table, rows, self.shapes), key=lambda x: x[1])
            predicted = rate
        shape = choice.fit(room)
        expected = 0.0 if self.fixed is not None else expected_tokens(self.acceptance, self.shapes).get(shape) \
            or shape_tokens(self.acceptance.cut_by_ends(max(shape.gamma, 1)), shape)  # a shape cut to the room
        # a round's time runs from the last one's end: its choice and bookkeeping are its costs too
        self.open = {"shape": shape, "rows": rows, "table": table, "start": now, "tokens": 0,
                     "expected": expected * rows, "predicted": predicted if shape == choice else None}
        return RoundBudget(shape.gamma, shape.tree)

    def close(self, outcome: RoundOutcome) -> RoundBudget | None:
        if outcome.gamma:
            self.acceptance.observe(outcome.paths(), sum(outcome.ended), sum(outcome.kept))
        self.kept = [a + k for a, k in zip(self.kept, outcome.kept)]
        if self.open is not None:
            self.open["tokens"] = sum(k for k, u in zip(outcome.kept, outcome.live) if u)
        if any(outcome.unfinished):
            return self.plan(outcome.remaining, outcome.unfinished)
        self._time_round(self.clock())
        return None

    def _time_round(self, now: float | None) -> None:
        """The running round ends at ``now`` (None: with the call, untimed): into its table and the log."""
        entry, self.open = self.open, None
        if entry is None:
            return
        seconds = 0.0 if now is None else now - entry["start"]
        if now is not None and self.fixed is None:
            entry["table"].record(entry["shape"], entry["tokens"], entry["expected"], seconds)
        self.log.append((entry["shape"].label, entry["rows"], entry["tokens"], seconds, entry["predicted"]))

    def close_plain_call(self, steps: int, rows: int) -> None:
        self.plain_call = (steps, rows)

    def report(self) -> dict[str, Any]:
        """``last_stats(model).auto``: the shapes taken, per shape its rounds, tokens and measured tokens per
        second, the predicted and measured rates of the chosen rounds, the acceptance, how the call ran."""
        now = self.clock()
        self._time_round(None)
        if self.fixed is None:
            if self.plain_call is not None:
                steps, rows = self.plain_call
                self.table.record_call("plain", steps * rows, now - self.created, steps)
            elif self.log:  # tokens as plain generate's (every row to the longest one's end), prefills' included
                self.table.record_call("speculative", (max(self.kept) + 1) * self.batch,
                                       max(now - self.created - sum(e[3] for e in self.log), 0.0),
                                       row_tokens=(1 + sum(e[2] / e[1] for e in self.log)) * self.batch)
            if self.save is not None:
                self.save(sorted(self.used))
        per_shape: dict[str, dict[str, Any]] = {}
        for label, _, tokens, seconds, _ in self.log:
            s = per_shape.setdefault(label, {"rounds": 0, "tokens": 0, "seconds": 0.0})
            s["rounds"], s["tokens"], s["seconds"] = s["rounds"] + 1, s["tokens"] + tokens, s["seconds"] + seconds
        for s in per_shape.values():
            s["measured_tokens_per_s"] = s["tokens"] / s["seconds"] if s["seconds"] > 0 else None
        chosen = [e for e in self.log if e[4] is not None and e[3] > 0]
        seconds = sum(e[3] for e in chosen)
        return {"shapes": ["plain generate"] if self.plain_call is not None else [e[0] for e in self.log],
                "per_shape": per_shape, "cost_key": self.key, "whole_call": self.whole_call,
                "predicted_tokens_per_s": sum(e[4] * e[3] for e in chosen) / seconds if seconds else None,
                "measured_tokens_per_s": sum(e[2] for e in chosen) / seconds if seconds else None,
                "acceptance": self.acceptance.as_profile(min(max(self.gamma, 1), 8), 4)}
