"""Answers as the rounds saw them, and the rounds a chain of γ takes over them.

Greedy drafting has a simple exact law. Where the draft, given the answer so far, would not propose the target's
next token, that token is *hard*; a chain round starting after ``k`` known tokens keeps its drafts up to the first
hard token and ends there (the target's token replaces it), or keeps all γ and the target's own token after them.
So an answer's hard tokens fix the rounds every chain takes over it: an answer of 34 tokens whose draft misses at
tokens 7 and 22 takes 5 rounds of chain 8 or of chain 7, 7 of chain 5, 9 of chain 3 (:func:`expected_rounds`). A
per-depth acceptance table (:mod:`hf_specmm.auto.acceptance`) averages that away: on the shipped world, whose
answers are runs of easy tokens between a few hard ones, it expected chain 8's rounds to keep 5.84 tokens of the
longest row at batch 8 where they kept 5.26, and chain 4's 3.83 where they kept 3.94, and so ranked chain 7 first
where chain 4 was 10 % faster.

Every round that drafts tells which of its tokens were hard: a chain's miss, a tree's path node that was not its
parent's first child, a tree's miss. The tokens no round drafted, a plain step's and the target's own token after a
round that kept all its drafts, the drafter tells when it next reads them (greedy calls:
:attr:`~hf_specmm.drafter.Proposal.read`, the draft's logits at each pending slot, in the forward that reads them
anyway). A token nothing told (a sampling call's; plain steps after a row's last drafted round) is *unknown*, and
:func:`expected_rounds` takes the expectation over it: a full round's next token hard with the per-depth table's
miss rate one depth past the round, a plain step's with the pooled rate (:meth:`AnswerBook.hard_rate`). Unknown
tokens were what made the book miss: before the drafter told them, the text-only draft's answers on the world had
hard tokens four apart, chain 3's rounds ended on them and never drafted one, and the book put chain 6 at batch 8
14 % above its rounds at the pooled rate, 7 % at the table's; told, it holds every chain's rounds exactly
(``tests/test_auto_runs.py``).

:class:`AnswerBook` keeps a model/draft pair's recent answers, each as its expected rounds per γ, and answers two
questions: the tokens a chain of γ keeps per round over answers one at a time (batch 1: the answers' tokens over
their rounds) and over batch calls, which last as long as their slowest row (the longest row's tokens over the most
rounds a row of the call takes).

The law is exact for a draft that reads tokens only; a feature head drafts deeper levels from its own predicted
features, so a token hard at depth 2 may be easy at depth 1, but on the world the book still ranked its chains far
better than the table (``docs/auto-design.md``). A drafter keeps answers where
:attr:`~hf_specmm.drafter.Drafter.misses_by_token` says the law holds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

EASY, HARD, UNKNOWN = 0, 1, 2
#: answers and batch calls an :class:`AnswerBook` keeps (the most recent)
ANSWERS, CALLS = 64, 16
#: answers (batch calls) before the book predicts chains' rounds
MIN_ANSWERS, MIN_CALLS = 8, 4
#: compared tokens before the pooled hard rate's counts are halved, and the prior's pseudo-tokens (rate 0.2)
RATE_CAP, RATE_PRIOR = 4000.0, 10.0


@dataclass
class Answer:
    """One row's answer as its rounds saw it: ``length`` tokens (the prefill's first one included), the token
    indices that were ``hard`` (the draft's first choice, given the answer before it, was not the target's) and
    ``unknown`` (never compared with a first choice), each with the depth a draft of it would have had (0: a plain
    step's token). Token 0 is the prefill's: the first round drafts token 1."""

    length: int = 1
    hard: set[int] = field(default_factory=set)
    unknown: dict[int, int] = field(default_factory=dict)

    def kinds(self) -> list[int]:
        """Per token 1..length-1: :data:`EASY`, :data:`HARD` or :data:`UNKNOWN` (index 0 unused)."""
        out = [EASY] * max(self.length, 1)
        for i in self.unknown:
            if 0 < i < self.length:
                out[i] = UNKNOWN
        for i in self.hard:
            if 0 < i < self.length:
                out[i] = HARD
        return out


def expected_rounds(answer: Answer, max_gamma: int, misses: Sequence[float]) -> list[float]:
    """E[rounds] of a chain of γ = 1..``max_gamma`` over ``answer``, an unknown token of depth d hard with
    probability ``misses[d]`` (the last entry for deeper ones).

    >>> answer = Answer(34, hard={7, 22})
    >>> [round(r, 2) for r in expected_rounds(answer, 8, [0.0])]
    [18.0, 12.0, 9.0, 8.0, 7.0, 6.0, 5.0, 5.0]
    >>> [round(r, 2) for r in expected_rounds(Answer(5, unknown={1: 0, 2: 0, 3: 0, 4: 0}), 2, [0.5])]
    [2.88, 2.62]
    """
    length = answer.length
    if length <= 1:
        return [0.0] * max_gamma
    kind = answer.kinds()
    rate = [0.0] * length  # an unknown token's probability of being hard
    for i, depth in answer.unknown.items():
        if 0 < i < length:
            rate[i] = misses[min(depth, len(misses) - 1)]
    nxt = [length] * (length + 1)  # nxt[p]: the first token ≥ p that is not easy (length: none)
    for p in range(length - 1, 0, -1):
        nxt[p] = p if kind[p] != EASY else nxt[p + 1]
    out = []
    for gamma in range(1, max_gamma + 1):
        rounds = [0.0] * (length + 1)  # rounds[k]: E[rounds] from k known tokens to the answer's end
        for k in range(length - 1, 0, -1):
            p, reach, total = k, 1.0, 0.0
            while True:
                e = nxt[p] if p < length else length
                if e >= k + gamma or e >= length:  # every draft kept: γ and the target's token
                    total += reach * rounds[min(k + gamma + 1, length)]
                    break
                if kind[e] == HARD:  # the target's token replaces the draft's
                    total += reach * rounds[e + 1]
                    break
                total += reach * rate[e] * rounds[e + 1]  # unknown: a miss, or kept and the drafts go on
                reach *= 1.0 - rate[e]
                p = e + 1
            rounds[k] = 1.0 + total
        out.append(rounds[1])
    return out


class AnswerRecorder:
    """One call's answers, built round by round (per batch row: tokens known, hard and unknown tokens)."""

    def __init__(self, batch: int):
        self.answers = [Answer() for _ in range(batch)]

    def plain(self, row: int, kept: int) -> None:
        """A plain step: its token was compared with nothing."""
        answer = self.answers[row]
        if kept:
            answer.unknown[answer.length] = 0
        answer.length += kept

    def record(self, proposal: Any, live: list[int], kept: list[int], stopped: list[bool], rows: list[int] | None,
               accepted: list[int] | None, tree: tuple[list, list] | None) -> None:
        """A verified round (:meth:`~hf_specmm.auto.budget.AutoBudget.observe`), per live cache row as its batch row
        (``rows``): first what the drafter read of the tokens before the round (``proposal.read``), then the round's
        own: a plain step (``accepted`` None), a chain (``accepted`` drafts each), a tree (``tree``: its path's
        children counts and ranks). A row whose answer ended in the round (EOS, max_length) kept at most its
        accepted drafts, or stopped at the target's own token."""
        row = (lambda i: i) if rows is None else rows.__getitem__
        if getattr(proposal, "read", None) is not None:
            read = proposal.read.tolist()
            for i in live:
                self.read(row(i), read[i])
        for i in live:
            if accepted is None:
                self.plain(row(i), kept[i])
                continue
            ended = kept[i] <= accepted[i] or stopped[i]
            if tree is None:
                self.chain(row(i), proposal.gamma, accepted[i], kept[i], ended)
            else:
                self.tree(row(i), tree[1][i], tree[0][i], accepted[i], kept[i], ended)

    def read(self, row: int, first: Sequence[int]) -> None:
        """The drafter's reading of the row's newest tokens (``first[j]`` for the ``len(first)``-th newest token
        plus j: 1 the draft's first choice, 0 not, -1 not known): what a plain step or a full round left unknown."""
        answer = self.answers[row]
        start = answer.length - len(first)
        for j, flag in enumerate(first):
            token = start + j
            if flag < 0 or token <= 0:
                continue
            answer.unknown.pop(token, None)
            if flag == 0:
                answer.hard.add(token)

    def chain(self, row: int, gamma: int, accepted: int, kept: int, ended: bool) -> None:
        """A chain round of ``gamma`` drafts with ``accepted`` of them taken and ``kept`` tokens kept (``ended``:
        the row's answer ended in it: nothing past its end was a trial)."""
        answer = self.answers[row]
        if not ended:
            if accepted < gamma:
                answer.hard.add(answer.length + accepted)
            else:
                answer.unknown[answer.length + gamma] = gamma + 1
        answer.length += kept

    def tree(self, row: int, ranks: Sequence[int], children: Sequence[int], accepted: int, kept: int,
             ended: bool) -> None:
        """A tree round: ``ranks[j]`` the rank of the accepted path's (j+1)-th node among its parent's children,
        ``children[j]`` how many the j-th path node had (j = 0 the root)."""
        answer = self.answers[row]
        start = answer.length
        for j in range(min(accepted, kept)):
            if ranks[j] > 0:
                answer.hard.add(start + j)
        if not ended:
            if accepted < len(children) and children[accepted] > 0:  # its children tried: none was the target's
                answer.hard.add(start + accepted)
            else:
                answer.unknown[start + accepted] = accepted + 1
        answer.length += kept


class AnswerBook:
    """A model/draft pair's recent answers, as the rounds of each chain they take (see the module)."""

    def __init__(self, max_gamma: int):
        self.max_gamma = max_gamma
        self.answers: deque[tuple[int, list[float]]] = deque(maxlen=ANSWERS)  # (tokens after the first, rounds)
        self.calls: deque[tuple[int, list[float]]] = deque(maxlen=CALLS)  # (longest row's, most rounds per γ)
        self.compared = [0.0, 0.0]  # hard tokens, tokens compared with a first choice

    def hard_rate(self) -> float:
        """Hard tokens over the tokens compared with a first choice, shrunk toward 0.2."""
        return (self.compared[0] + 0.2 * RATE_PRIOR) / (self.compared[1] + RATE_PRIOR)

    def add_call(self, answers: Sequence[Answer], misses: Sequence[float]) -> None:
        """A call's answers (rows with no round, a one-token answer, are left out); ``misses[d - 1]``: the per-depth
        table's probability that a draft at depth d is not the target's token (its first choice)."""
        for a in answers:
            hard = len([i for i in a.hard if 0 < i < a.length])
            unknown = len([i for i in a.unknown if 0 < i < a.length and i not in a.hard])
            self.compared[0] += hard
            self.compared[1] += a.length - 1 - unknown
        if self.compared[1] > RATE_CAP:
            self.compared = [self.compared[0] / 2.0, self.compared[1] / 2.0]
        rates = [self.hard_rate(), *misses]  # depth 0: a plain step's token
        rows = [(a.length - 1, expected_rounds(a, self.max_gamma, rates)) for a in answers if a.length > 1]
        if not rows:
            return
        self.answers.extend(rows)
        if len(answers) > 1:
            longest = max(tokens for tokens, _ in rows)
            self.calls.append((longest, [max(r[g] for _, r in rows) for g in range(self.max_gamma)]))

    def chain_tokens(self, batch: bool) -> list[float] | None:
        """Tokens per round of a chain of γ = 1..max_gamma (1 + drafts kept): over answers one at a time, or
        (``batch``) over batch calls' slowest rows. None until there are :data:`MIN_ANSWERS` answers
        (:data:`MIN_CALLS` batch calls)."""
        rows = self.calls if batch else self.answers
        if len(rows) < (MIN_CALLS if batch else MIN_ANSWERS):
            return None
        tokens = sum(t for t, _ in rows)
        out = []
        for g in range(self.max_gamma):
            rounds = sum(r[g] for _, r in rows)
            out.append(max(tokens / rounds, 1.0) if rounds > 0 else 1.0)
        return out
