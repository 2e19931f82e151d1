"""How far Auto's cost model misjudges two shapes when the machine's speed drifts: a simulation, no model run.

    PYTHONPATH=. python benchmarks/auto_cost_drift.py

A chain (γ 5) is taken every round but one in ``--gap``, which takes a tree (2, 4, 8); each round's time is its
true cost × the machine's speed (a random walk of ``--walk`` per round, clipped to 0.5-2x) × per-round noise
(log-normal, ``--noise``). After every round the predicted time ratio tree / chain (curves × time factors,
``hf_specmm.auto.policy.round_time`` and ``CostTable.time_factor``) is compared with the true one; reported: the
mean and the worst |log error| after the first 500 rounds, over ``--seeds`` runs, for ``CostTable`` as shipped
and for the design it replaced (curves that keep the recent raw timings of every width taken, every round's
ratio in its shape's factor, speed index weight 0.1), re-implemented below for the comparison only.
"""

from __future__ import annotations

import argparse
import math
import random

from hf_specmm.auto.costs import KIND_SAMPLES, RATIO_STRENGTH, SAMPLES, CostTable
from hf_specmm.auto.policy import Shape, round_time
from hf_specmm.trees import TreeShape

CHAIN, TREE = Shape(5), Shape(4, TreeShape(2, 4, 8))
TRUE = {CHAIN: (0.010, 0.015), TREE: (0.012, 0.020)}  # seconds: drafting, verification
REPLACED_SHAPE_SAMPLES = 16


class ReplacedCostTable(CostTable):
    """The design before: raw timings rolling into the curves, every round's ratio into its shape's factor."""

    def __init__(self) -> None:
        super().__init__()
        self.shape_ratios: dict[str, list[float]] = {}

    def add(self, kind: str, width: int, draft_label: str | None, draft_s: float, verify_s: float) -> None:
        self.version += 1
        for values, seconds in ((self.verify[kind].setdefault(width, []), verify_s),
                                (self.draft.setdefault(draft_label, []) if draft_label else None, draft_s)):
            if values is not None:
                values.append(seconds)
                del values[:-SAMPLES]

    def observe_ratio(self, kind: str, predicted_s: float, measured_s: float) -> None:
        # the simulation has one shape per kind, so the replaced per-shape factors are keyed by kind here
        ratio = min(max(measured_s / predicted_s, 0.25), 4.0)
        relative = self.relative_factor(kind)
        for table, keep in ((self.shape_ratios, REPLACED_SHAPE_SAMPLES), (self.kind_ratios, KIND_SAMPLES)):
            table.setdefault(kind, []).append(ratio / self.speed)
            del table[kind][:-keep]
        self.speed += 0.1 * (ratio / relative - self.speed)

    def relative_factor(self, kind: str) -> float:
        pooled = super().relative_factor(kind)
        own = self.shape_ratios.get(kind, [])
        return (sum(own) + RATIO_STRENGTH * pooled) / (len(own) + RATIO_STRENGTH)


def simulate(table: CostTable, seed: int, rounds: int, gap: int, noise: float, walk: float) -> tuple[float, float]:
    rng = random.Random(seed)
    speed = 1.0

    def timed(shape: Shape) -> tuple[float, float]:
        f = speed * math.exp(rng.gauss(0.0, noise))
        return TRUE[shape][0] * f, TRUE[shape][1] * f

    for shape in (CHAIN, TREE):  # calibration: a few rounds of each
        for _ in range(3):
            table.add(shape.kind, shape.width, shape.draft_label, *timed(shape))
    truth = sum(TRUE[TREE]) / sum(TRUE[CHAIN])
    errors = []
    for i in range(rounds):
        speed = min(max(speed * math.exp(rng.gauss(0.0, walk)), 0.5), 2.0)
        shape = TREE if i % gap == gap - 1 else CHAIN
        draft_s, verify_s = timed(shape)
        table.observe_ratio(shape.kind, round_time(table, shape), draft_s + verify_s)
        table.add(shape.kind, shape.width, shape.draft_label, draft_s, verify_s)
        predicted = [round_time(table, s) * table.time_factor(s.kind) for s in (TREE, CHAIN)]
        errors.append(abs(math.log(predicted[0] / predicted[1] / truth)))
    tail = errors[500:]
    return sum(tail) / len(tail), max(tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--noise", type=float, default=0.2)
    args = parser.parse_args()
    print("| model | speed walk / round | tree every | mean abs log error | worst |")
    print("|---|---|---|---|---|")
    for walk in (0.0, 0.03):
        for gap in (16, 64):
            for name, make in (("shipped", CostTable), ("replaced", ReplacedCostTable)):
                runs = [simulate(make(), s, args.rounds, gap, args.noise, walk) for s in range(args.seeds)]
                mean = sum(r[0] for r in runs) / len(runs)
                print(f"| {name} | {walk} | {gap} | {mean:.3f} | {max(r[1] for r in runs):.3f} |")


if __name__ == "__main__":
    main()
