"""How a drafter picks its next token: the :class:`Selector` protocol and the loop's implementation.

A drafter calls ``token, q = select(draft_logits, j)`` once per drafted position j and stops its round
early once ``select.stop`` is True. Behind the call are three named parts: the draft's logits go through
the logits processors the target's tokens go through (:meth:`DraftSelector.scores`, with each row's
history plus the j tokens drafted before), a token is chosen (:meth:`DraftSelector.choose`: argmax, or a
sample whose distribution q_j is returned for lossless verification), and the chosen token is written
into the row histories (:meth:`DraftSelector.write_history`) so that history-dependent processors see it
at later positions, exactly as they will when the target scores the block.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .history import apply_processors, apply_processors_along_paths
from .rows import Rows


class Selector(Protocol):
    """What a drafter receives in :meth:`~hf_specmm.drafter.Drafter.propose`."""

    #: True once every row has stopped drafting this round (``assistant_confidence_threshold``): the drafter
    #: then returns the tokens drafted so far
    stop: bool

    def __call__(self, draft_logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """d_{j+1} [A] from the target-vocabulary draft logits [A, V] of step j, and its distribution
        q_{j+1} [A, V] when sampling (else None)."""
        ...


def choose(scores: torch.Tensor, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next token from processed scores [A, V]: argmax, or a sample (returned with its distribution)."""
    if not do_sample:
        return scores.argmax(-1), None
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1).squeeze(-1), probs


class DraftSelector:
    """The loop's :class:`Selector`. Applies ``assistant_confidence_threshold`` per row as stock does for its
    one row: a row whose chosen draft token has probability below the threshold keeps that token and drafts
    no more this round (``lengths``); ``stop`` once every row has."""

    def __init__(self, processors: Any, rows: Rows, do_sample: bool, threshold: float | None):
        self.processors, self.rows, self.do_sample, self.threshold = processors, rows, do_sample, threshold
        self.lengths: torch.Tensor | None = None  # [A] drafts each row in the caches proposes this round
        self.stop = False

    def start_round(self, gamma: int, device: torch.device) -> None:
        self.stop = False
        self.lengths = None
        if self.threshold is not None:
            self.lengths = torch.full((len(self.rows.in_cache),), gamma, device=device)

    def round_lengths(self, gamma: int) -> torch.Tensor | None:
        """[A] drafts each row proposed in a round that drafted ``gamma`` (None: all of them)."""
        return None if self.lengths is None or gamma == 0 else self.lengths.clamp_max(gamma)

    def scores(self, draft_logits: torch.Tensor, j: int) -> torch.Tensor:
        return apply_processors(self.processors, self.rows.history, draft_logits[:, None], offset=j,
                                rows=self.rows.cache_index)[:, 0]

    def level_scores(self, draft_logits: torch.Tensor, depth: int, paths: torch.Tensor | None = None) -> torch.Tensor:
        """Processed scores [A, K, V] of K tree nodes at ``depth`` (draft logits [A, K, V]); ``paths`` [A, K, depth]:
        each node's root path below the root, which history-reading processors see after the row's history."""
        if paths is None or depth == 0:
            return apply_processors(self.processors, self.rows.history, draft_logits, offset=depth,
                                    rows=self.rows.cache_index)
        depths = torch.full(paths.shape[:2], depth, device=paths.device)
        return apply_processors_along_paths(self.processors, self.rows.history, draft_logits, paths, depths,
                                            rows=self.rows.cache_index)

    def write_history(self, token: torch.Tensor, j: int) -> None:
        self.rows.history.write(token[:, None], offset=j, rows=self.rows.cache_index)

    def __call__(self, draft_logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        scores = self.scores(draft_logits, j)
        token, q_j = choose(scores, self.do_sample)
        self.write_history(token, j)
        if self.lengths is not None:
            probs = q_j if q_j is not None else scores.softmax(-1)
            unsure = probs.gather(1, token[:, None]).squeeze(1) < self.threshold
            drafting = self.lengths > j
            self.lengths = torch.where(drafting & unsure, torch.full_like(self.lengths, j + 1), self.lengths)
            self.stop = not bool((self.lengths > j + 1).any())
        return token, q_j


class ArgmaxSelector:
    """A :class:`Selector` with no processors and no history: the draft's own argmax (step-cost probes).

    Example::

        >>> import torch
        >>> ArgmaxSelector()(torch.tensor([[0.1, 2.0, -1.0]]), 0)
        (tensor([1]), None)
    """

    stop = False

    def __call__(self, draft_logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return choose(draft_logits, do_sample=False)
