"""Whole calls as plain ``generate``: whether a call with ``hf_specmm.Auto`` runs stock's own decoding loop (no
draft) rather than the speculative one, chosen from whole calls of each kind timed next to each other
(:meth:`~hf_specmm.auto.costs.CostTable.stock_share`), and the timing of those calls. :class:`WholeCalls` is that
side of :class:`~hf_specmm.auto.budget.AutoBudget`; the rounds' side (each round's shape) is in ``budget.py``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..hooks import this_call
from .acceptance import AcceptanceTable
from .costs import CostTable
from .policy import PLAIN, Choice, CostAwarePolicy, FixedPolicy

#: calls run as plain generate only when a typical call is predicted this much faster so (see :meth:`runs_plain`)
STOCK_MARGIN = 1.05
MIN_RATE_ROUNDS = 2  # chosen rounds a call needs for its realised rate to count
#: calls between two of the kind not chosen (plain generate, speculative): FIRST_CALL_GAP after a switch, doubling
#: up to MAX_CALL_GAP while those calls leave the choice as it was (AutoBudget._now_and_then)
FIRST_CALL_GAP, MAX_CALL_GAP = 8, 64
#: calls in a row that make such a call while it leaves no pair (an answer too short for a rate)
CHECK_TRIES = 4
#: the k-th such call comes frac(k · GOLDEN) · (gap / 4 + 1) calls after the gap (:func:`check_offset`)
GOLDEN = 0.6180339887498949
#: pairs of calls (plain generate beside speculative ones) before the whole calls' choice: until then they alternate
MIN_PAIRS = 3
#: drafted rounds a pair's acceptance must have seen before a ranking of plain steps sends its calls to plain generate
EVIDENCE_ROUNDS = 4
#: evaluated probes in a row that lost to plain steps before such a ranking sends calls to plain generate
PROBES_LOST = 2


class WholeCalls:
    """The whole-call side of :class:`~hf_specmm.auto.budget.AutoBudget` (a mixin): it reads the budget's policy,
    its call's cost table and pair's acceptance, its ranking and its log of rounds (declared below)."""

    policy: CostAwarePolicy | FixedPolicy
    costs: CostTable
    acceptance: AcceptanceTable
    ranking: Callable[[CostTable], list[Choice]]
    log: list[dict[str, Any]]
    #: how :meth:`runs_plain` chose for this call (``last_stats(model).auto["whole_call"]``; None: no choice made)
    whole_call: dict[str, Any] | None
    plain_forwards: list[float]
    calibration_rounds: int
    row_tokens: list[int]

    def runs_plain(self) -> bool:
        """Whether this call is best run as plain ``generate`` (stock's own decoding loop, no draft). Once the costs are
        calibrated, one call runs as plain generate (it is plain generate: no slower than plain), its steps and what it
        spent outside them (set-up, the prefill) timed; from then on a call runs so where the last calls' lengths
        (:data:`~hf_specmm.auto.costs.LENGTH_CALLS`, the workload's mix) would take :data:`STOCK_MARGIN` less time that
        way, whole calls compared (the draft's prefill and set-up included; :meth:`CostTable.stock_share`): an
        overhead-bound machine (tiny models, a fast GPU at small batches), once there are :data:`MIN_PAIRS` pairs of
        calls of the two kinds next to each other (until then the calls alternate, each making one: on the world at
        batch 1 one pair's share ranged from 0.74 to 1.23 over two diagnosis runs of the feature head, and the choice
        was made from the first). Whichever wins, a call of the other now and then (:meth:`_now_and_then`: the 8th after
        a switch, then 16, ... up to :data:`MAX_CALL_GAP` calls apart while they agree) keeps both sides measured next
        to each other in time: costs, acceptance and the rates current, and plain generate's side no older than the
        speculative one's (measured once, a slow spell of the speculative calls alone flipped the choice). Measured
        calls, not predictions: one pessimistic prediction (on the world, an image-adapter draft predicted below plain
        generate while its chain 5 ran at 1.13x plain) would hold for up to 64 calls. A ranking of plain steps sends
        calls to plain generate only once the pair's acceptance has seen :data:`EVIDENCE_ROUNDS` drafted rounds: a new
        draft on costs already calibrated (another draft's, a costs file) was ranked by the prior alone, and its calls
        ran as plain generate, which observes no acceptance, until the 8th (on cpu-proxy, where its chain 8 ran at 1.7x
        plain). Nor before :data:`PROBES_LOST` probes in a row (the best drafted shape, the other kind's best:
        :meth:`_probe`) realised less than the plain steps beside them: a ranking of plain steps rests on the cost
        curves too, and calibrated in an unusual spell (an H200's first rounds) they ranked plain steps first where a
        fixed chain ran 2x plain."""
        if isinstance(self.policy, FixedPolicy) or not self.policy.calibrated(self.costs):
            return False
        state = (id(self.costs), self.costs.version, self.acceptance.rounds)
        if self.acceptance.plain_ranking is None or self.acceptance.plain_ranking[0] != state:
            ranked = self.ranking(self.costs)  # unchanged while calls run as plain generate
            if not ranked:
                return False
            self.acceptance.plain_ranking = (state, ranked[0].shape)
        if self.costs.stock_step_time() is None:  # plain generate never measured: this call measures it
            return self._chose(True, "plain generate unmeasured")
        share = None
        if self.acceptance.plain_ranking[1] == PLAIN:  # the loop would take plain steps only
            if self.acceptance.rounds < EVIDENCE_ROUNDS:  # by the prior alone: a speculative call, its probes evidence
                return self._chose(False, "plain steps ranked first, too few drafted rounds")
            # the costs measured, too: plain generate once the probes of both kinds lost (a probe that beat plain
            # steps says the curves are wrong: calls go on probing)
            if self.acceptance.probe_won is not None or self.acceptance.probes_lost < PROBES_LOST:
                return self._chose(False, "plain steps ranked first, probes not lost")
            wins, by = True, "plain steps ranked first"
        elif len(self.costs.pairs) < MIN_PAIRS:  # too few pairs to choose by: each call makes one more
            return self._chose(self.costs.last_call == "spec", "too few pairs")
        else:  # whole calls, by the recent pairs
            share = self.costs.stock_share()
            wins, by = plain_wins(share), "share"
        chosen = "plain" if wins else "speculative"
        plain = self._now_and_then(chosen)
        return self._chose(plain, by, share, check=plain != (chosen == "plain"))

    def _chose(self, plain: bool, by: str, share: float | None = None, check: bool = False) -> bool:
        """Record how this call was chosen (:attr:`whole_call`) and return ``plain``: ``by`` the rule that chose,
        ``share`` plain generate's predicted time over the speculative loop's (when it chose), ``check`` whether the
        call is of the kind not chosen (:meth:`_now_and_then`)."""
        self.whole_call = {"plain_generate": plain, "by": by, "share": share, "check": check}
        return plain

    def _now_and_then(self, chosen: str) -> bool:
        """Whether this call runs as plain generate, the whole-call choice being ``chosen`` ('plain',
        'speculative'): now and then a call of the other kind, compared with the calls next to it
        (:meth:`CostTable.stock_share`). The gap is :data:`FIRST_CALL_GAP` calls after a switch and doubles (up to
        :data:`MAX_CALL_GAP`) each time such a call's own pair agreed with the choice; one that disagreed is
        followed by another at the same gap (the choice is the median over the recent pairs: a few such pairs
        turn it). The gap used to double as the call was made, whatever it showed: a choice of plain generate
        made in a slow spell then held until the 58th call (checks at the 8th, 24th and 56th;
        ``test_a_choice_of_plain_generate_made_in_a_slow_spell_is_undone_by_the_checks``). On the shipped world
        at batch 8 the text-only draft's calls ran as plain generate for all 20 timed calls of a diagnosis run
        while its chain 2 ran 1.26x faster. A check that leaves no pair (a one-token answer has no rate, a one-step
        plain generate call no step) is made again on the next call, :data:`CHECK_TRIES` calls in a row at most: at
        the gap it fell on the same prompt each time where calls cycle through 8 prompts, and on the world at batch 1
        that prompt's answer was one token: 2 pairs in 64 calls, and the feature head's calls held plain generate.
        The k-th check comes :func:`check_offset` calls after its gap: at gaps of 8, 16, 32, 64 calls over 32
        prompts in a cycle (the shipped world's bench) every check from the second on fell on the same prompt, beside
        the same three, so every recent pair priced the workload by those four prompts, and which four was the
        process's luck (the text-only draft at batch 1 ran speculative at 0.88x plain in one whole-world run, as
        plain generate in others). The schedule is the call's cost table's (:class:`Regime`)."""
        state = self.acceptance.regimes.setdefault(self.costs, Regime())
        costs = self.costs
        checked, state.checking = state.checking, None  # the last call here was a check: (pairs before it, tries)
        if chosen != state.chosen:  # a switch (or the first choice): the other kind is checked soon
            state.chosen, state.gap, state.calls = chosen, FIRST_CALL_GAP, 0
        elif checked is not None and costs.paired == checked[0] and checked[1] < CHECK_TRIES:
            # the check left no pair (an answer of one round has no rate): again, on the next call (a later prompt)
            state.checking = (costs.paired, checked[1] + 1)
            return chosen == "speculative"
        elif checked is not None and costs.paired > checked[0] and costs.lengths:
            # the check's pair (it and the call beside it): if it agrees, check less often
            if plain_wins(costs.pair_share(costs.pairs[-1])) == (chosen == "plain"):
                state.gap = min(2 * state.gap, MAX_CALL_GAP)
        state.calls += 1
        if state.calls >= state.gap + check_offset(state.checks, state.gap):  # the other kind, beside this one
            state.calls, state.checking, state.checks = 0, (costs.paired, 1), state.checks + 1
            return chosen == "speculative"
        return chosen == "plain"

    def timing_plain(self, target: Any) -> Any:
        """A forward pre-hook on ``target`` timing plain generate's steps into the cost table (remove it after)."""
        starts = self.plain_forwards = []

        def mark(module: Any, args: tuple) -> None:
            now = time.perf_counter()
            if len(starts) >= 2:  # the step before: the interval between two decoding forwards
                self.costs.add_stock_step(now - starts[-1])
            starts.append(now)

        self.log.append({"shape": "plain generate", "predicted": None, "tokens": 0, "seconds": 0.0, "rows": 0,
                         "expected": None})
        return target.register_forward_pre_hook(this_call(mark))  # this call's forwards only

    def _time_call(self, seconds: float, chosen: list[dict[str, Any]]) -> None:
        """The call into the call's cost table (:meth:`runs_plain`): a speculative call's realised rate, its
        seconds outside its rounds and its longest row (not a call with calibration rounds: their shapes are no
        choice); plain generate's seconds outside its decoding steps, its mean step and its longest row."""
        if isinstance(self.policy, FixedPolicy) or not self.log:
            return
        if self.log[0]["shape"] == "plain generate":
            starts = self.plain_forwards  # the prefill's forward, then one per decoding step
            if len(starts) >= 3:
                step = (starts[-1] - starts[1]) / (len(starts) - 2)
                self.costs.add_stock_call(max(seconds - (len(starts) - 1) * step, 0.0), step, len(starts) - 1)
        elif not self.calibration_rounds:
            # the call's longest row's tokens per second of its rounds, as plain generate's side is its longest row's
            # steps: tokens per row-second weight each round by its live rows, and at batch 8 on the world the
            # 8-row rounds then stood for the longest row's time, run mostly in 1-3-row rounds (a call's decode time
            # predicted 8-29 % too long by the medians of the calls before, within 3 % so)
            decode = sum(e["seconds"] for e in chosen)
            whole = len(chosen) == len(self.log)  # every round chosen (none a fallback): row_tokens are theirs
            row_seconds = decode if whole else sum(e["seconds"] * e["rows"] for e in chosen)
            enough = len(chosen) >= MIN_RATE_ROUNDS and row_seconds > 0
            tokens = max(self.row_tokens) if whole else sum(e["tokens"] for e in chosen)
            rate = tokens / row_seconds if enough else None
            round_s = decode / len(chosen) if enough else None
            self.costs.add_call(rate, round_s, max(seconds - sum(e["seconds"] for e in self.log), 0.0),
                                max(self.row_tokens))


def check_offset(checks: int, gap: int) -> int:
    """Calls added to ``gap`` before a regime's ``checks``-th check (0 for the first): the golden-ratio sequence
    over [0, gap / 4], so that checks do not fall on the same call of a workload that repeats itself (a fixed
    list of prompts in a loop) and the pairs they make see its mix, deterministically.

    >>> [check_offset(k, 64) for k in range(6)]
    [0, 10, 4, 14, 8, 1]
    """
    return int((checks * GOLDEN) % 1.0 * (gap // 4 + 1))


def plain_wins(share: float | None) -> bool:
    """Whether plain generate's whole calls win at this share (plain generate's time over the speculative
    loop's, :meth:`CostTable.stock_share`): :data:`STOCK_MARGIN` less time."""
    return share is not None and share * STOCK_MARGIN < 1.0


@dataclass
class Regime:
    """The whole calls' choice in one cost table (:meth:`WholeCalls._now_and_then`). Per table, not per model/draft
    pair: a table is a batch bucket, plain generate may win at batch 1 and lose at 8, and one schedule for both
    started over at every switch, so calls alternating between the two never checked the kind not chosen."""

    chosen: str | None = None  # 'plain' generate or 'speculative'
    calls: int = 0  # calls since the last one of the kind not chosen
    gap: int = FIRST_CALL_GAP  # calls between two of those
    #: after such a call (a check): the table's pairs made before it, and the calls in a row made so
    checking: tuple[int, int] | None = None
    checks: int = 0  # checks made (their offsets: check_offset)
