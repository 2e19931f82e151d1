"""Round times and rates: each shape's round time from its own recent rounds, and a linear round-time model over
shapes that is only the prior for shapes not yet run. One :class:`Table` per cost key (target, draft, device, dtype,
batch bucket, cache kind); :mod:`~hf_specmm.auto.store` keeps them for the process and in costs files."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..trees.expand import TreeShape
from .shapes import PLAIN, Shape

#: every weight and count is multiplied by this once per round (a plain call: once per step), so evidence fades
#: after about 1 / (1 − DISCOUNT) rounds and a changed machine, draft or workload is followed
DISCOUNT = 0.995
#: pseudo-rounds of the prior in every estimate (a shape's rate, the round-time model, the acceptance)
PRIOR_ROUNDS = 2.0
#: a block width's first rounds in a process are not timed: one-time costs (kernel selection, allocations)
COLD_ROUNDS = 3
#: the round-time model's prior, as shares of a plain step: per verified token, per draft step or tree level
PRIOR_COSTS = (1 / 64, 0.1)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gauss-Jordan elimination with partial pivoting (a is small, symmetric positive definite)."""
    n, m = len(b), [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in (r for r in range(n) if r != c):
            f = m[r][c] / m[c][c]
            m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[r][n] / m[r][r] for r in range(n)]


class Table:
    """One cost key's evidence, every sum discounted by :data:`DISCOUNT` per round. ``arms[label] = [rounds, prior
    rounds, tokens, expected tokens, seconds]``: the shape's timed rounds after :data:`PRIOR_ROUNDS` of the prior
    (timed at the model's time when a rate is asked: :meth:`rates`), with the tokens the acceptance table expected
    of them; ``calls``: whole calls, ``plain`` generate's ``[calls, tokens, seconds, steps]``, ``speculative`` ones'
    ``[calls, tokens, seconds outside their rounds, row tokens]`` (:meth:`record_call`); ``widths``: rounds run at
    each block width in this process (the first :data:`COLD_ROUNDS` untimed)."""

    def __init__(self, data: dict[str, Any] | None = None):
        data = data or {}
        self.arms: dict[str, list[float]] = {}
        self.calls: dict[str, list[float]] = {k: list(map(float, v)) for k, v in data.get("calls", {}).items()}
        # the fit's sums, kept as rounds are recorded (a fit makes no pass over the arms): Σ rounds·f fᵀ | Σ seconds·f
        # over arms of PRIOR_ROUNDS rounds or more (``active``), Σ f fᵀ | Σ mean round·f over the others (``faded``)
        self.gram, self.faded, self.active = [0.0] * 20, [0.0] * 20, set()
        for k, v in data.get("arms", {}).items():
            if v[0] - v[1] > 1e-200 and v[4] > 0:  # own rounds and their seconds: none where a file has none
                self.arms[k] = list(map(float, v))
                self._account(k, 1.0)
        self.widths: dict[int, int] = {}
        self.called: set[str] = set()  # kinds of call run in this process
        self.version = 0  # changes with every timed round and call: the fitted model is cached by it
        self._fit: tuple[tuple, list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": 4, "arms": {k: [float(f"{x:.6g}") for x in v] for k, v in self.arms.items()},
                "calls": {k: [float(f"{x:.6g}") for x in v] for k, v in self.calls.items()}}  # faded sums stay > 0

    def tick(self, rounds: int = 1) -> None:
        factor = DISCOUNT ** rounds
        for sums in (*self.arms.values(), *self.calls.values()):
            sums[:] = [x * factor for x in sums]
        self.gram = [x * factor for x in self.gram]
        for label in [k for k in self.active if self.arms[k][0] - self.arms[k][1] < PRIOR_ROUNDS]:  # at the floor
            self._account(label, -1.0)
            self._account(label, 1.0)
        for label in [k for k, v in self.arms.items() if v[0] < 1e-200]:  # forgotten before it underflows
            self._account(label, -1.0)
            del self.arms[label]
            self.version += 1

    def _account(self, label: str, sign: float) -> None:
        """Adds (``sign`` 1) or removes (−1) the arm ``label``'s terms in the fit's sums, as its rounds are now."""
        (rounds, prior, *_, seconds), (outer, f) = self.arms[label], _terms(label)
        rounds -= prior  # its own rounds: the fit is the prior of shapes, not its own input
        if sign > 0 and rounds >= PRIOR_ROUNDS:
            self.active.add(label)
        sums, w, m = (self.gram, rounds, seconds) if label in self.active else (self.faded, 1.0, seconds / rounds)
        sums[:] = [s + sign * x for s, x in zip(sums, [w * o for o in outer] + [m * x for x in f])]
        if sign < 0:
            self.active.discard(label)

    def record(self, shape: Shape, tokens: float, expected: float, seconds: float) -> bool:
        """A round of ``shape`` kept ``tokens`` (the acceptance table expected ``expected``) in ``seconds``; whether
        it was timed (its width's first :data:`COLD_ROUNDS` rounds in the process are not)."""
        self.tick()
        seen = self.widths.get(shape.width, 0)
        self.widths[shape.width] = seen + 1
        if seen < COLD_ROUNDS or seconds <= 0:
            return False
        if shape.label not in self.arms:  # the prior's rounds, timed at the model's time whenever a rate is asked
            self.arms[shape.label] = [PRIOR_ROUNDS * x for x in (1.0, 1.0, expected, expected, 0.0)]
        else:
            self._account(shape.label, -1.0)
        sums = self.arms[shape.label]
        for i, x in enumerate((1.0, 0.0, tokens, expected, seconds)):
            sums[i] += x
        self._account(shape.label, 1.0)
        self.version += 1
        return True

    def record_call(self, kind: str, tokens: float, seconds: float, steps: int = 0,
                    row_tokens: float = 0.0) -> None:
        """A call of ``kind``: ``tokens`` its rows × its longest row's new tokens (``plain``: ``steps`` steps, each
        a round's discount; ``speculative``: ``seconds`` outside its rounds, ``row_tokens`` per live row × rows)."""
        if steps:
            self.tick(steps)
        first, self.called = kind not in self.called, self.called | {kind}
        if seconds >= 0 and not (first and kind == "speculative"):
            new = (1.0, tokens, seconds, steps if kind == "plain" else row_tokens)
            self.calls[kind] = [a + b for a, b in zip(self.calls.get(kind, [0.0] * 4), new)]
            self.version += 1

    def model(self, base: "Table | None" = None) -> list[float]:
        """The round-time model θ: seconds ≈ θ · :attr:`Shape.features`, fitted to every timed shape's mean round
        (weighted by its rounds, at least :data:`PRIOR_ROUNDS`), pulled by :data:`PRIOR_ROUNDS` toward a prior:
        ``base``'s θ (another batch bucket's of the same models) where it has timed rounds, else
        :data:`PRIOR_COSTS`, in proportion, scaled to this table's timed rounds; before any, to plain ``generate``'s
        steps, or ``base``'s θ itself."""
        other = base if base is not None and base is not self else None
        version = (self.version, other, other and other.version)
        if self._fit is not None and self._fit[0] == version:
            return self._fit[1]
        calls, _, seconds, steps = self.calls.get("plain", (0.0,) * 4)
        if not self.arms and other is not None and not steps:
            return other.model()
        fitted = other.model() if other is not None and other.arms else None
        shares = [max(x, 0.0) / fitted[0] for x in fitted] if fitted and fitted[0] > 0 else \
            [1.0, PRIOR_COSTS[0], PRIOR_COSTS[1], PRIOR_COSTS[1]]
        gram = [g + PRIOR_ROUNDS * x for g, x in zip(self.gram, self.faded)]
        # the scale: a plain step as the timed rounds' time implies it under the shares, else as plain calls' steps
        seconds -= calls * self.call_rate("speculative")[1]
        scale = gram[16] / _dot(shares, gram[:4]) if self.arms else \
            seconds / steps if steps > 1e-9 and seconds > 0 else 1.0
        theta0 = [scale * x for x in shares]
        # each parameter's pull: PRIOR_ROUNDS rounds of a typical shape's feature (1, 32 tokens, 4 steps, 4 levels)
        pull = [PRIOR_ROUNDS * x * x for x in (1.0, 32.0, 4.0, 4.0)]
        a = [[gram[4 * i + j] + (pull[i] if i == j else 0.0) for j in range(4)] for i in range(4)]
        b = [gram[16 + i] + pull[i] * theta0[i] for i in range(4)]
        theta = _solve(a, b)
        self._fit = (version, theta)
        return theta

    def predicted_seconds(self, shape: Shape, theta: list[float]) -> float:
        """A round of ``shape`` by the model: never below a plain step's, nor a draft's steps below zero."""
        return max(_dot(theta, shape.features), theta[0], 1e-9)

    def rates(self, shapes: list[Shape], rows: int, tokens_per_row: dict[Shape, float],
              theta: list[float]) -> list[tuple[float, float]]:
        """(tokens per second, rounds of evidence) of each shape at ``rows`` live rows: the table's ``tokens_per_row``
        (a tree's scaled by its rounds' kept over expected tokens: the drafter picks its nodes) over the model's
        round time, or a timed shape's own after :data:`PRIOR_ROUNDS` pseudo-rounds at the model's time now (they
        fade with its evidence: an estimate keeps its share of the prior as it ages, and its optimism grows)."""
        out, arms = [], self.arms
        for s in shapes:
            sums = arms.get(s.label)
            if sums is None:
                out.append((tokens_per_row[s] * rows / self.predicted_seconds(s, theta), 0.0))
            else:
                w, prior, tokens, expected, seconds = sums
                per_row = tokens_per_row[s] * (tokens / expected if s.tree is not None and expected > 0 else 1.0)
                out.append((per_row * rows * w / (seconds + prior * self.predicted_seconds(s, theta)), w))
        return out

    def call_rate(self, kind: str) -> tuple[float, float, float, float]:
        """(tokens, seconds, steps or row tokens, calls of evidence) of a mean call of ``kind``; zeros until one ran."""
        w, *sums = self.calls.get(kind, (0.0,) * 4)
        return (*(x / w for x in sums), w) if w > 1e-9 else (0.0,) * 4  # type: ignore[return-value]


def _dot(a: list[float], b: tuple[float, ...]) -> float:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]  # every shape, every round: no generator


@lru_cache(maxsize=1024)
def _terms(label: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A shape's features f and their products f fᵀ (16, row-major), by its label."""
    f = _shape_of(label).features  # type: ignore[union-attr]
    return tuple(x * y for x in f for y in f), f


@lru_cache(maxsize=1024)
def _shape_of(label: str) -> Shape | None:
    """The shape a label names (``plain``, ``chain 3``, ``tree 4,6,24``); None for another label."""
    kind, _, rest = label.partition(" ")
    try:
        n = [int(x) for x in rest.split(",")] if rest else []
        if min(n, default=0) < 0 or (kind, len(n)) not in (("plain", 0), ("chain", 1), ("tree", 3)):
            return None
        return PLAIN if kind == "plain" else Shape(n[0]) if kind == "chain" else Shape(n[1], TreeShape(*n))
    except ValueError:
        return None
