"""``AutoBudget``: the draft budget of one ``generate`` call with ``hf_specmm.Auto`` — the one decision rule.

Every shape (a plain step, a chain, a tree) is an arm; so are whole calls of plain ``generate`` and of the
speculative loop. Each arm's rate (tokens per second) is estimated from its own recent rounds (calls), with
:data:`~hf_specmm.auto.costs.PRIOR_ROUNDS` rounds of a prior: the acceptance table's expected tokens over the
round-time model's seconds (:class:`~hf_specmm.auto.costs.Table`). The arm taken is the one with the highest
optimistic rate, ``rate · (1 + EXPLORE / √(1 + n))`` with n its discounted rounds of evidence (UCB): an arm
is explored while its estimate is within its uncertainty of the best, and again once its evidence has faded.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from ..budget import DraftBudget, RoundBudget, RoundOutcome
from .acceptance import AcceptanceTable, chain_lengths, tree_nodes
from .costs import Table
from .shapes import PLAIN, Shape

#: the optimism of an arm without evidence: its rate may be this much above its estimate
EXPLORE = 0.1
#: rounds between two computations of the shapes' expected tokens from the acceptance table (it moves slowly)
REFRESH = 16


def expected_tokens(acceptance: AcceptanceTable, shapes: list[Shape]) -> dict[Shape, float]:
    """1 + E[accepted drafts] per row of each shape under the acceptance table, cached on the table for
    :data:`REFRESH` of its rounds."""
    cached = getattr(acceptance, "_expected", None)
    if cached is not None and acceptance.rounds - cached[0] < REFRESH and all(s in cached[1] for s in shapes):
        return cached[1]
    depth = max((s.gamma for s in shapes), default=1)
    p = acceptance.probabilities(max(depth, 1))
    chains = chain_lengths(p, max(depth, 1))
    out = {s: 1.0 + (sum(v for _, _, v in tree_nodes(p, s.tree.top_k, s.tree.depth, s.tree.nodes)) if s.tree
                     else chains[s.gamma - 1] if s.gamma else 0.0) for s in shapes}
    acceptance._expected = (acceptance.rounds, out)  # type: ignore[attr-defined]
    return out


class AutoBudget(DraftBudget):
    """Chooses each round's shape among ``shapes`` (or takes ``fixed`` shapes in turn), learns acceptance from
    every round and costs from every timed round; ``tables(rows)`` gives (key, table) of a round's live rows."""

    def __init__(self, shapes: list[Shape], acceptance: AcceptanceTable, tables: Callable[[int], tuple[str, Table]],
                 batch: int, fixed: list[Shape] | None = None, save: Callable[[list[str]], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(gamma=max(s.gamma for s in (fixed or shapes)))
        self.shapes, self.fixed, self.acceptance, self.tables = shapes, fixed, acceptance, tables
        self.clock, self.save = clock, save
        self.key, self.table = tables(batch)
        self.used = {self.key}
        self.open: dict[str, Any] | None = None
        self.log: list[tuple[str, int, float, float, float | None]] = []  # shape, rows, tokens, seconds, predicted
        self.plain_call: tuple[int, int] | None = None  # (steps, rows) once the call ran as plain generate
        self.whole_call: dict[str, Any] | None = None
        self.cold = [0, 0.0]  # tokens and seconds of untimed (cold) rounds: no whole call's evidence
        self.created = clock()

    # ---- choosing --------------------------------------------------------------------------------------
    def scores(self, table: Table, rows: int, shapes: list[Shape]) -> list[tuple[float, float, Shape]]:
        """(rate, optimistic rate, shape) of every shape in ``table`` for ``rows`` live rows."""
        theta = table.model(self.table)
        expected = expected_tokens(self.acceptance, shapes)
        out = []
        for s in shapes:
            rate, n = table.rate(s, rows, expected[s], theta)
            out.append((rate, rate * (1.0 + EXPLORE / math.sqrt(1.0 + n)), s))
        return out

    def runs_plain(self) -> bool:
        """Whole calls are arms too: plain ``generate`` (prior: a plain step's rate) against the speculative loop
        (prior: the best drafted shape's rate), each by its own recent calls' tokens per second."""
        if self.fixed is not None or not self.shapes or self.shapes[0] != PLAIN:
            return False
        scored = self.scores(self.table, 1, self.shapes)
        drafted = max((r for r, _, s in scored if s.gamma), default=0.0)
        plain, n_plain = self.table.call_rate("plain", scored[0][0])
        spec, n_spec = self.table.call_rate("speculative", drafted)
        bonus = [x * (1.0 + EXPLORE / math.sqrt(1.0 + n)) for x, n in ((plain, n_plain), (spec, n_spec))]
        # a kind of call never run has no estimate (stock's loop costs less than the rounds' plain steps): each is
        # run once, the speculative first
        chosen = n_spec > 0 and (n_plain == 0 or bonus[0] > bonus[1])
        self.whole_call = {"plain_generate": chosen, "plain_rate": plain, "speculative_rate": spec}
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
            rate, _, choice = max(self.scores(table, rows, self.shapes), key=lambda x: x[1])
            predicted = rate
        shape = choice.fit(room)
        self.open = {"shape": shape, "rows": rows, "table": table, "start": self.clock(), "tokens": 0,
                     "predicted": predicted if shape == choice else None}
        return RoundBudget(shape.gamma, shape.tree)

    def close(self, outcome: RoundOutcome) -> RoundBudget | None:
        if outcome.gamma:
            self.acceptance.observe(outcome.paths())
        if self.open is not None:
            self.open["tokens"] = sum(k for k, u in zip(outcome.kept, outcome.live) if u)
        return self.plan(outcome.remaining, outcome.unfinished) if any(outcome.unfinished) else None

    def _time_round(self, now: float | None) -> None:
        """The running round ends at ``now`` (None: with the call, untimed): into its table and the log."""
        entry, self.open = self.open, None
        if entry is None:
            return
        seconds = 0.0 if now is None else now - entry["start"]
        if now is not None and self.fixed is None and \
                not entry["table"].record(entry["shape"], entry["rows"], entry["tokens"], seconds):
            self.cold[0], self.cold[1] = self.cold[0] + entry["tokens"], self.cold[1] + seconds
        self.log.append((entry["shape"].label, entry["rows"], entry["tokens"], seconds, entry["predicted"]))

    # ---- the call's end --------------------------------------------------------------------------------
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
            elif self.log:
                self.table.record_call("speculative", sum(e[2] for e in self.log) - self.cold[0],
                                       now - self.created - self.cold[1])
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
        return {
            "shapes": ["plain generate"] if self.plain_call is not None else [e[0] for e in self.log],
            "per_shape": per_shape,
            "predicted_tokens_per_s": sum(e[4] * e[3] for e in chosen) / seconds if seconds else None,
            "measured_tokens_per_s": sum(e[2] for e in chosen) / seconds if seconds else None,
            "acceptance": self.acceptance.as_profile(min(max(self.gamma, 1), 8), 4),
            "cost_key": self.key,
            "whole_call": self.whole_call,
        }
