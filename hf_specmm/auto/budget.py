"""``AutoBudget``: the draft budget of one ``generate`` call with ``hf_specmm.Auto``. Each round it asks the
policy for the shape (a plain step, a chain, a tree), times the round's two phases into the cost table and
feeds the verification's outcome to the acceptance table; :meth:`report` is ``last_stats().auto``."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from typing import Any, Callable

import torch

from ..budget import DraftBudget, RoundBudget
from .acceptance import AcceptanceTable, tree_observations
from .calls import WholeCalls
from .costs import SAMPLES, CostTable
from .policy import PLAIN, Choice, CostAwarePolicy, FixedPolicy, Shape, fit, hold
from .runs import AnswerRecorder

REFRESH, MAX_REFRESH = 8, 64  # rounds between two rankings of the candidate shapes (the tables move slowly)
MIN_PROBE_GAP, MAX_PROBE_GAP = 8, 256
#: one drafted round in EXPLORE_GAP (at first; one per ranking's refresh, up to MAX_REFRESH, once the best holds)
#: takes, in turn, a contender predicted within EXPLORE_BAND of the best; contenders of the other kind while its time
#: factor has fewer than SURE_CONTRASTS samples first, at the first gap
EXPLORE_GAP, EXPLORE_BAND, SURE_CONTRASTS = 8, 0.10, 8
#: the other kind's best drafted shape is a contender too while predicted within this of the best (or while its
#: kind's time factor has fewer than SURE_CONTRASTS samples, at the refresh's pace)
OTHER_KIND_BAND = 0.25


class AutoBudget(WholeCalls, DraftBudget):
    """A :class:`~hf_specmm.budget.DraftBudget` whose every round has the shape chosen by ``policy``.

    Plain steps are taken while nothing drafted pays; after ``acceptance.probe_gap`` plain steps in a row the
    best drafted shape is tried once (its outcome is evidence: a draft that got better is noticed), and the gap
    doubles, up to :data:`MAX_PROBE_GAP`, so a useless draft costs ever fewer probes. A probe that realised more
    tokens per second than the plain steps before it is tried again at once, until one does not or a drafted
    shape ranks best: its timings are what corrects cost curves timed in an unusual spell (on an H200 the
    calibration rounds took 3-7x the same shapes' fixed rounds, plain steps ranked first, and the probes, one per
    doubling gap, kept 48 tokens/s against plain steps' 36 without moving a curve's median).
    """

    def __init__(self, policy: CostAwarePolicy | FixedPolicy, acceptance: AcceptanceTable,
                 tables: Callable[[int], tuple[str, CostTable]], batch: int, devices: tuple[torch.device, ...],
                 on_calibrated: Callable[[list[str]], None] | None = None, answers: bool = False,
                 first_choices: bool = False):
        depth = policy.max_depth if isinstance(policy, CostAwarePolicy) else max(s.gamma for s in policy.shapes)
        super().__init__(gamma=depth)
        self.policy, self.acceptance, self.tables = policy, acceptance, tables
        #: the cost table of the call's batch bucket (calibrated first; see :meth:`_costs`), and every one used
        self.cost_key, self.costs = tables(batch)
        self.used = {self.cost_key: self.costs}
        self.batch_tables = {self.costs} if batch > 1 else set()  # tables of rounds with several live rows
        self.devices = tuple(d for d in devices if d.type == "cuda")
        self.on_calibrated = on_calibrated
        self.open: dict[str, Any] | None = None  # the running round: shape, choice, start, draft end, tokens
        self.log: list[dict[str, Any]] = []  # closed rounds
        self.ranked: list[Choice] = []
        self.ranked_by: CostTable | None = None
        self.next_ranking = 0
        self.rounds = 0
        self.plain_run = 0
        self.calibration_rounds = 0
        self.plain_forwards: list[float] = []  # a call run as plain generate: when each target forward started
        self.whole_call: dict[str, Any] | None = None  # how runs_plain chose (WholeCalls._chose)
        self.created = time.perf_counter()  # the call's start (the budget is made as it starts)
        self.row_tokens: list[int] = [0] * batch  # tokens each batch row kept in the call's rounds
        #: the best drafted shape the call's own table ranked last (see :meth:`_held`)
        self.own_best: Shape | None = None
        #: the rows' hard tokens, for the pair's AnswerBook at the call's end (a draft that misses a token whatever
        #: depth drafts it; see Auto.budget)
        self.answers = AnswerRecorder(batch) if answers else None
        #: the drafter reports which pending tokens were its first choice (greedy calls): no token stays unknown
        self.needs_first_choices = answers and first_choices

    # ---- the loop's hooks ------------------------------------------------------------------------------
    def for_round(self, remaining: list[int], unfinished: list[bool]) -> RoundBudget:
        now = time.perf_counter()
        self._close(now, timed=True)
        room = max(r for r, u in zip(remaining, unfinished) if u) - 1
        rows = sum(unfinished)
        timed, costs = self._costs(rows)
        choice = self._choose(timed, costs, room)
        shape = fit(choice.shape, room)
        # the round starts after the choice: ranking the candidates is no shape's cost
        self.open = {"shape": shape, "choice": choice, "start": time.perf_counter(), "drafted": None, "tokens": 0,
                     "rows": rows, "table": timed,
                     "chooser": self.ranked_by if choice.curve_seconds > 0 else None}
        self.rounds += 1
        self.acceptance.clock += 1
        return RoundBudget(shape.gamma, shape.tree)

    def drafted(self) -> None:
        if self.open is not None and self.open["shape"].gamma:
            for device in self.devices:  # the draft's kernels are done: what follows is the verification's
                torch.cuda.synchronize(device)
            self.open["drafted"] = time.perf_counter()

    def observe(self, proposal: Any, accepted: Any, unfinished: list[bool], kept: list[int],
                stopped: list[bool], rows: list[int] | None = None) -> None:
        """A verified round: which drafted ranks the target took, per row still generating. A row whose end (EOS,
        ``max_length``) came inside its accepted drafts kept ``kept`` ≤ n of them: what was drafted past its end
        is no trial (the target's tokens after EOS are no answer), so its observation stops there, a success.
        (Counted, every answer's last round added a failure at a random depth: on the shipped world, 4-5 rounds
        per answer, the table expected 4.1 tokens per round of chain 4 where its rounds kept 4.7.) ``rows``: the
        batch row of each cache row (the call's answers are per batch row)."""
        live = [i for i, u in enumerate(unfinished) if u]
        self.acceptance.observe_ends(sum(kept[i] for i in live), sum(stopped[i] for i in live))
        n, tree = None, None  # a plain step's (or a round with no live row's): nothing drafted to observe
        if proposal.gamma and live:
            n = accepted.n.tolist()
            ended = [kept[i] <= n[i] for i in live]  # the end came at draft kept[i]
            taken = [kept[i] if end else n[i] for i, end in zip(live, ended)]
            if proposal.tree is None:
                self.acceptance.observe_chain(taken, [k if end else proposal.gamma for k, end in zip(taken, ended)])
            else:
                tree = tree_observations(proposal.tree, accepted.n, accepted.path)
                counts, ranks = tree
                self.acceptance.observe_tree(taken, [counts[i] for i in live], [ranks[i] for i in live], ended)
        if self.answers is not None:
            self.answers.record(proposal, live, kept, stopped, rows, n, tree)

    def update(self, kept: list[int], gamma_used: int) -> None:
        if self.open is not None:
            self.open["tokens"] += sum(kept)
        if len(kept) > len(self.row_tokens):
            self.row_tokens += [0] * (len(kept) - len(self.row_tokens))
        for i, k in enumerate(kept):
            self.row_tokens[i] += k

    # ---- choosing --------------------------------------------------------------------------------------
    def _costs(self, rows: int) -> tuple[CostTable, CostTable]:
        """The table a round of ``rows`` live rows is timed into (its batch bucket's: rows that finished leave the
        batch, and a narrower batch verifies faster) and the table it is chosen by: the live one once calibrated,
        else the call's own once that is. A narrower bucket is reached only by a batch call's last rounds (2-3
        per bucket and call on the world at batch 8): calibrating each there took its calibration shapes, wide
        trees included, for tens of calls; it fills in from the chosen rounds instead and chooses once it has
        every calibration timing (a call that starts at its batch size calibrates it)."""
        if isinstance(self.policy, FixedPolicy):
            return self.costs, self.costs
        key, live = self.tables(rows)
        if key not in self.used:  # a bucket holds 1 live row or several, never both: its first round tells which
            self.used[key] = live
            if rows > 1:
                self.batch_tables.add(live)
        if live is not self.costs and not self.policy.calibrated(live) and self.policy.calibrated(self.costs):
            return live, self.costs
        return live, live

    def _choose(self, timed: CostTable, costs: CostTable, room: int) -> Choice:
        if isinstance(self.policy, FixedPolicy):
            return Choice(self.policy.next(), None, 0.0)
        previous = self.log[-1]["shape"] if self.log else None  # the call's last round's (closed before the choice)
        calibrating = self.policy.calibrating(timed, room, previous) if costs is timed else None
        if calibrating is not None:
            self.calibration_rounds += 1
            return Choice(calibrating, None, 0.0, calibrating=True)
        if not self.policy.calibrated(costs) and self.policy.calibrated(self.costs):
            costs = self.costs  # near max_length no calibration shape fits: the call's bucket chooses
        if not self.policy.calibrated(costs):  # the rest does not fit near max_length: no cost model yet
            return Choice(self.policy.fallback, None, 1.0)
        if self.calibration_rounds and self.on_calibrated is not None:
            self.on_calibrated(list(self.used))  # once per call that finished a calibration (saves the costs file)
            self.on_calibrated = None
        if not self.ranked or self.rounds >= self.next_ranking or self.ranked_by is not costs:
            self.ranked, self.ranked_by = self._held(self.ranking(costs), costs), costs
        if not self.ranked:
            return Choice(self.policy.fallback, None, 1.0)
        best = self.ranked[0]
        if best.shape.gamma:
            self.plain_run, self.acceptance.probe_gap, self.acceptance.probe_won = 0, MIN_PROBE_GAP, None
            self.acceptance.probes_lost = 0
            # explored only in rounds of the call's own batch bucket, timed into the table that chose them: elsewhere
            # (a narrower bucket's table, still filling in) a round's time is no contrast (CostTable.observe_ratio),
            # and a batch call's last rounds, which a narrower table chooses once calibrated, are what the call waits
            # for, its other rows done: on the world at batch 8 the text-only draft's calls explored trees there
            # (6-9 ms 1-row rounds where its chain took 4-5), 0.35 explored rounds a call against 0.17 without
            return self._contender(best) if timed is costs and costs is self.costs else best
        self.plain_run += 1
        pair = self.acceptance
        if self.plain_run > pair.probe_gap or pair.probe_won is not None:
            probe, last_of_turn = self._probe()
            if probe is not None:
                self.plain_run = 0
                if pair.probe_won is None and last_of_turn:  # every kind's probe lost at this gap
                    pair.probe_gap = min(2 * pair.probe_gap, MAX_PROBE_GAP)
                self.ranked = []  # rank again after the probe's evidence
                pair.rankings.clear()
                # measured against measured: the speed index moves with the probes' own rounds
                plain = [e["tokens"] / e["rows"] / e["seconds"] for e in self.log[-32:]
                         if e["shape"] == PLAIN.label and e["rows"] and e["seconds"] > 0][-8:]
                return dataclasses.replace(probe, versus=statistics.median(plain) if plain else
                                           best.predicted_tokens_per_s)
        return best

    def _held(self, ranked: list[Choice], costs: CostTable) -> list[Choice]:
        """``ranked`` as this call takes it. In a batch call's last rounds, chosen by a narrower bucket's table, the
        best shape the call's own table ranked keeps its place unless the narrower table's best is predicted
        :data:`~hf_specmm.auto.policy.SWITCH_MARGIN` faster (:func:`~hf_specmm.auto.policy.hold`'s margin, across
        the change of table, within a family too). Those rounds run the longest row's last tokens, fewer than the
        narrower table's ends expect of a row (its answers' ends are geometric, its rows whole answers), so its
        deeper shapes keep no more there: on the shipped world at batch 8 the feature head's 1-row rounds took the
        batch-1 table's chain 7, 9.4 ms each, where a fixed chain 5's took 7.9 ms, and as many of them (30 in
        six passes of its four calls). A switch of family also pays for its realised share and time factor,
        learned from its own rounds, which the last rounds (1-3 a call) never pay back (the text-only draft's calls
        took chain 2 and ended in two 1-row rounds of tree 4,3,24, 9-10 ms each for 3 tokens each, the batch-1
        table's best by 2 %, where a fixed chain 2's calls ended in two rounds of about 5 ms for the same 3 tokens
        each: Auto took 1.13x the fixed chain's time a call)."""
        if costs is self.costs:
            if ranked and ranked[0].shape.gamma:
                self.own_best = ranked[0].shape
            return ranked
        return hold(ranked, self.own_best, family_moves=False)

    def _probe(self) -> tuple[Choice | None, bool]:
        """The drafted shape a probe takes, and whether it is the last of its turn: the one whose last probe won,
        again; else, in turn, the best drafted shape and the best of the other kind (chains, trees), the gap
        doubling once both lost. The other kind too: a probe's timings correct only its own shapes' curves, and
        where every drafted round was timed too slow (an H200's calibration) the best drafted shape by those
        curves need not be the best one."""
        pair, drafted = self.acceptance, [c for c in self.ranked if c.shape.gamma]
        again = next((c for c in drafted if c.shape == pair.probe_won), None)
        if again is not None or not drafted:
            return again, True
        other = next((c for c in drafted if c.shape.kind != drafted[0].shape.kind), None)
        kinds = [drafted[0]] if other is None else [drafted[0], other]
        pair.probe_turn = pair.probe_turn % len(kinds) + 1
        return kinds[pair.probe_turn - 1], pair.probe_turn == len(kinds)

    def _contender(self, best: Choice) -> Choice:
        """``best``, or once per exploration gap, in turn, one of the contenders: the drafted shapes predicted within
        :data:`EXPLORE_BAND` of it, and the best drafted shape of the other kind (the best chain where a tree is
        best, the best tree where a chain is) while within :data:`OTHER_KIND_BAND` (an explored round costs what its
        shape is predicted to lose, one round in 8 at first). A shape's timings and realised share are refreshed
        only by the rounds that take it: a kind whose predictions went stale (its curves timed in a slow minute)
        would otherwise never be taken again (on the world at batch 1, Auto kept taking trees that ran at 0.86x
        plain where the best fixed chain ran at 0.99x). The gap is :data:`EXPLORE_GAP` drafted rounds while a
        contender of the other kind than the best's has a time factor resting on fewer than :data:`SURE_CONTRASTS`
        samples (those go first: with rounds 20-30 % apart by noise alone, a few samples cannot tell kinds 5-10 %
        apart; and only a round of the other kind is a contrast, :meth:`CostTable.observe_ratio`: taking turns with
        every unsure contender, trees of the best's own kind included, 1 of 8 processes on the world at batch 8
        whose chains' calibration was timed 1.4x slow was back on chains within 48 calls, 4 of 8 with the other
        kind first; ``benchmarks/auto_recovery.py``), else it grows with the ranking's refresh (up to
        :data:`MAX_REFRESH`) while the best shape holds: each explored round may be that much slower, and a settled
        ranking needs them rarely. (Leaving the other kind's best to the slow pace alone let the top-4 trees hold two
        drafts at batch 1 on the world, 7 % and 19 % behind the best chain.) The other kind's best predicted further
        behind than the band is a contender at that pace while its kind's factor has few contrasts: its curves may
        have been timed in a slow spell, and nothing else times them again (with it, 7 of 8 of those processes were
        back on chains within 48 calls). Each cost table counts its own rounds to the gap: a batch call's last rounds
        are chosen by a narrower bucket's table, whose explorations (one in 8 at each call's tail on the world at
        batch 8) reset a shared count before the call's own table reached its gap of 16-64 rounds. The contender
        returned is marked ``explored`` (``last_stats(model).auto["explored_rounds"]`` counts them)."""
        pair, costs = self.acceptance, self.ranked_by
        if costs is None:  # no ranking (cannot happen: _choose ranks first)
            return best
        exploring = pair.exploring.setdefault(costs, [0, 0])
        exploring[0] += 1
        if exploring[0] < EXPLORE_GAP:  # no gap is shorter: the contenders are not looked for (most rounds)
            return best
        other = next((c for c in self.ranked[1:] if c.shape.gamma and c.shape.kind != best.shape.kind), None)
        unknown = other is not None and costs.contrasts(other.shape.kind) < SURE_CONTRASTS  # its kind's factor
        shared = pair.rankings.get(costs)
        slow_gap = max(EXPLORE_GAP, shared["refresh"] if shared else 0)
        if not unknown and exploring[0] < slow_gap:  # the gap is the slow one: not reached
            return best
        band = (1.0 - EXPLORE_BAND) * best.predicted_tokens_per_s  # ranked[1:] is best first (hold moves only [0])
        near = [c for c in itertools.takewhile(lambda c: c.predicted_tokens_per_s >= band, self.ranked[1:])
                if c.shape.gamma and not covered(c.shape, best.shape, costs)]
        inside = other is not None and \
            other.predicted_tokens_per_s >= (1.0 - OTHER_KIND_BAND) * best.predicted_tokens_per_s
        if other is not None and other not in near and (inside or unknown):
            near.append(other)
        # while the other kind's factor is unknown its contenders go first (its best beyond the band does not)
        unsure = [c for c in near if unknown and c.shape.kind != best.shape.kind and (c is not other or inside)]
        gap = EXPLORE_GAP if unsure else slow_gap
        if exploring[0] < gap or not near:
            return best
        exploring[0] = 0
        pool = unsure or near
        pick = pool[exploring[1] % len(pool)]
        if costs.recorded(pick.shape.label, pick.shape.kind, pick.shape.width, pick.shape.draft_label):
            exploring[1] += 1  # else its first round is not recorded (CostTable.first_round): its turn again next time
        return dataclasses.replace(pick, explored=True)

    def ranking(self, costs: CostTable) -> list[Choice]:
        """The candidates ranked by ``costs`` and this pair's acceptance, best first (per row: the live rows
        change). A ranking is 0.3-1 ms of Python (91 candidates), so it is shared by the pair's calls and made
        again only every ``refresh`` rounds: :data:`REFRESH`, doubling up to :data:`MAX_REFRESH` while the best shape holds (the
        tables move slowly); a short call mostly reuses the last call's. The last best keeps its place unless a
        shape of its family or one predicted :data:`~hf_specmm.auto.policy.SWITCH_MARGIN` faster is best
        (:func:`~hf_specmm.auto.policy.hold`): a switch to another family pays for learning its realised share and
        time factor again, one within a family does not (a margin there held chain 4 on the shipped world where
        chain 5 was predicted 2 % and ran 7 % faster)."""
        shared = self.acceptance.rankings.get(costs)
        rounds = self.acceptance.clock
        if shared is not None and rounds < shared["until"]:
            self.next_ranking = self.rounds + shared["until"] - rounds
            return shared["ranked"]
        ranked = self.policy.rank(self.acceptance, costs, 1, costs in self.batch_tables)
        last = shared["ranked"][0].shape if shared is not None and shared["ranked"] else None
        ranked = hold(ranked, last)
        same = bool(ranked) and ranked[0].shape == last
        refresh = min(2 * shared["refresh"], MAX_REFRESH) if same else REFRESH
        self.acceptance.rankings[costs] = {"ranked": ranked, "refresh": refresh, "until": rounds + refresh}
        self.next_ranking = self.rounds + refresh
        return ranked

    def _close(self, now: float, timed: bool) -> None:
        """End the running round at ``now``: its timings into the cost table (``timed``), its line into the log."""
        if self.open is None:
            return
        entry, self.open = self.open, None
        shape: Shape = entry["shape"]
        seconds = now - entry["start"]
        draft = (entry["drafted"] - entry["start"]) if entry["drafted"] is not None else 0.0
        choice = entry["choice"]
        # a calibration round is timed only at the call's start or after a round of its shape (its run:
        # CostAwarePolicy.calibrating); the log holds the call's closed rounds
        if timed and not isinstance(self.policy, FixedPolicy) and \
                not entry["table"].first_round(shape.label, shape.kind, shape.width, shape.draft_label) and \
                (not choice.calibrating or not self.log or self.log[-1]["shape"] == shape.label):
            if choice.curve_seconds > 0 and shape == choice.shape and entry["chooser"] is entry["table"]:
                # the speed index first: add() divides by it (a round chosen by another bucket's curves: no ratio)
                entry["table"].observe_ratio(shape.kind, choice.curve_seconds, seconds)
            entry["table"].add(shape.kind, shape.width, shape.draft_label, draft, max(seconds - draft, 0.0))
        # (not the call's last round, whose time has the call's end; nor one cut short by max_length)
        if timed and choice.versus is not None and shape == choice.shape and entry["rows"] and seconds > 0:
            # a probe that beat plain steps is evidence that the curves rank drafted rounds too slow (timed in an
            # unusual spell): the next round probes again, so its timings reach the curves' medians
            won = entry["tokens"] / entry["rows"] / seconds > choice.versus
            self.acceptance.probe_won = shape if won else None
            self.acceptance.probes_lost = 0 if won else self.acceptance.probes_lost + 1
            if won:
                self.acceptance.probe_gap = MIN_PROBE_GAP
        if choice.predicted_tokens_per_s is not None and shape == choice.shape and shape.gamma and entry["rows"]:
            # what this family's rounds realise of the table's expectation (AcceptanceTable.yield_of), over every
            # live row: a row that stops in the round (EOS, max_length) keeps only what its end allows
            self.acceptance.observe_yield(shape.family, choice.accepted,
                                          max(entry["tokens"] / entry["rows"] - 1.0, 0.0))
        per_row = choice.predicted_tokens_per_s
        self.log.append({"shape": shape.label, "predicted": None if per_row is None else per_row * entry["rows"],
                         "tokens": entry["tokens"], "explored": choice.explored,
                         "seconds": seconds, "rows": entry["rows"],
                         "expected": choice.expected_tokens if choice.predicted_tokens_per_s is not None else None})

    # ---- what the call did -----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """``last_stats(model).auto``: per shape taken, its rounds, tokens, measured and predicted tokens per
        second (predictions exist for rounds the cost model chose: not for calibration or fixed rounds)."""
        now = time.perf_counter()
        self._close(now, timed=False)  # the last round ends with the call
        chosen = [e for e in self.log if e["predicted"] is not None]  # the rounds the cost model chose
        self._time_call(now - self.created, chosen)
        if self.rounds and self.answers is not None:  # (a call run as plain generate compared no token)
            book = self.acceptance.answers
            misses = [1.0 - row[0] for row in self.acceptance.probabilities(book.max_gamma + 1, 1)]
            book.add_call(self.answers.answers, misses)
        per_shape: dict[str, dict[str, Any]] = {}
        for entry in self.log:
            s = per_shape.setdefault(entry["shape"], {"rounds": 0, "tokens": 0, "seconds": 0.0, "row_rounds": 0,
                                                      "predicted": [], "expected": []})
            s["rounds"] += 1
            s["tokens"] += entry["tokens"]
            s["seconds"] += entry["seconds"]
            s["row_rounds"] += entry["rows"]
            if entry["predicted"] is not None:
                s["predicted"].append(entry["predicted"])
                s["expected"].append(entry["expected"])
        for s in per_shape.values():
            predicted, expected, row_rounds = s.pop("predicted"), s.pop("expected"), s.pop("row_rounds")
            s["measured_tokens_per_s"] = s["tokens"] / s["seconds"] if s["seconds"] > 0 else None
            s["predicted_tokens_per_s"] = sum(predicted) / len(predicted) if predicted else None
            # tokens a row kept per round: measured, and as the acceptance table expected it
            s["measured_tokens_per_round"] = s["tokens"] / row_rounds if row_rounds else None
            s["expected_tokens_per_round"] = sum(expected) / len(expected) if expected else None
        tokens, seconds = sum(e["tokens"] for e in chosen), sum(e["seconds"] for e in chosen)
        return {
            "shapes": [e["shape"] for e in self.log],
            "per_shape": per_shape,
            "calibration_rounds": self.calibration_rounds,
            "explored_rounds": sum(1 for e in self.log if e.get("explored")),
            "predicted_tokens_per_s": (sum(e["predicted"] * e["seconds"] for e in chosen) / seconds) if seconds else None,
            "measured_tokens_per_s": tokens / seconds if seconds else None,
            "acceptance": self.acceptance.as_profile(min(self.gamma, 8), 4),
            "cost_key": self.cost_key,
            "whole_call": self.whole_call,
        }


def covered(shape: Shape, best: Shape, costs: CostTable | None) -> bool:
    """Whether a round of ``shape`` taken to explore it could not change its prediction beside ``best``'s: a chain
    no deeper than the best chain (every depth it drafts, the best chain's rounds observe; the family's realised
    share is one) whose block width and drafting have :data:`~hf_specmm.auto.costs.SAMPLES` timings each (its curve
    points are fixed). Such rounds cost what the shape is slower, for nothing: on the shipped world at batch 1,
    where the EAGLE-3 head's chain 8 ranked best, 19 of the 20 rounds of one diagnosis run's 48 calls that took
    another shape were chains 5-7."""
    return shape.tree is None and best.tree is None and shape.gamma <= best.gamma and costs is not None and \
        costs.samples(shape.kind, shape.width, shape.draft_label) >= SAMPLES

