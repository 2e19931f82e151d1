"""A round's shape (a plain target step, a chain of γ, a draft tree), the grid ``Auto`` chooses from, and the
checks of a user's ``shapes``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Sequence

from ..trees.expand import TreeShape

#: the tree grid: top_k × depth × nodes (kept where valid, within max_depth and max_tokens)
TREE_GRID = ((2, 4, 8), (3, 4, 6, 8), (8, 16, 32, 64))
#: the documented maximum of ``Auto(max_depth=)``: a round drafts at most this many levels
MAX_DEPTH = 32


@dataclass(frozen=True)
class Shape:
    """One round's shape: ``gamma`` 0 is a plain target step; with ``tree`` a draft tree (γ its depth)."""

    gamma: int
    tree: TreeShape | None = None

    @property
    def width(self) -> int:
        """Tokens the target verifies in the round's one forward."""
        return 1 + (self.tree.nodes if self.tree is not None else self.gamma)

    @cached_property  # labels and features are looked up for every shape in every round
    def label(self) -> str:
        if self.tree is not None:
            return f"tree {self.tree.top_k},{self.tree.depth},{self.tree.nodes}"
        return f"chain {self.gamma}" if self.gamma else "plain"

    def __hash__(self) -> int:  # shapes key dicts every round: their labels' hashes are cached
        return hash(self.label)

    @cached_property
    def features(self) -> tuple[float, float, float, float]:
        """The round-time model's inputs (:class:`~hf_specmm.auto.costs.Table`): 1, width − 1, chain steps,
        tree levels."""
        chain = float(self.gamma) if self.tree is None else 0.0
        return 1.0, float(self.width - 1), chain, float(self.gamma) - chain

    def fit(self, room: int) -> "Shape":
        """The shape cut to ``room`` drafts (near ``max_length``): at most ``room`` levels."""
        if self.gamma <= room:
            return self
        if room < 1:
            return PLAIN
        return Shape(room, self.tree.cut(room) if self.tree is not None else None)


PLAIN = Shape(0)


@lru_cache(maxsize=64)  # the same Shape objects every call: their labels and features are computed once
def candidates(max_tokens: int, max_depth: int, plain: bool = True, trees: bool = True) -> tuple[Shape, ...]:
    """Plain, chains of γ 1..``max_depth`` (≤ ``max_tokens``) and the :data:`TREE_GRID` trees that fit."""
    shapes = [PLAIN] if plain else []
    shapes += [Shape(g) for g in range(1, min(max_depth, max_tokens) + 1)]
    if trees:
        shapes += [Shape(d, TreeShape(k, d, n)) for k in TREE_GRID[0] for d in TREE_GRID[1] for n in TREE_GRID[2]
                   if d <= max_depth and k < n <= min(max_tokens, k + (d - 1) * k * k)]
    return tuple(shapes)


def parse_shapes(shapes: Any, max_tokens: int) -> list[Shape]:
    """``Auto(shapes=)``: a list of ints (chains of γ; 0 a plain step) and ``TreeShape``s, each checked here."""
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or not shapes:
        raise ValueError(f"Auto shapes must be a non-empty list of ints (chains; 0: a plain step) and "
                         f"hf_specmm.TreeShape trees, got {shapes!r}")
    out = []
    for s in shapes:
        if isinstance(s, TreeShape):
            shape = Shape(s.depth, s)
        elif isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_DEPTH:
            shape = Shape(s)
        else:
            raise ValueError(f"Auto shapes: {s!r} is not a shape: give an int 0..{MAX_DEPTH} (a chain of γ; 0: a plain "
                             "step) or an hf_specmm.TreeShape(top_k, depth, nodes)")
        if shape.width - 1 > max_tokens:
            raise ValueError(f"Auto shapes: {shape.label} drafts more than max_tokens={max_tokens}")
        if shape.gamma > MAX_DEPTH:
            raise ValueError(f"Auto shapes: {shape.label} is deeper than the maximum depth {MAX_DEPTH}")
        out.append(shape)
    return out
