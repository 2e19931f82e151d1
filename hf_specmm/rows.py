"""The rows of a speculative ``generate`` call: what each has emitted, whether it has finished, what
plain ``generate`` would have kept of a block of new tokens (stopping criteria, ``max_length``), and
which of them are still in the caches.

Two numberings meet in the loop: *batch rows* (the call's B rows, what the user sees, what histories and
processors index) and *cache rows* (the A ≤ B rows still in the target's and the draft's caches, in cache
order: finished rows leave the caches in groups). :class:`Rows` maps between them both ways:
``in_cache[a]`` is the batch row of cache row a, :meth:`Rows.to_batch` scatters a per-cache-row tensor to
the batch, :meth:`Rows.to_cache` gathers a per-batch-row list for the cache rows. A round converts in two
calls: :meth:`Rows.start_round` (what the rows may do, both numberings) and :meth:`Rows.keep` (what they
kept of the verifier's acceptance: the round's :class:`~hf_specmm.budget.RoundOutcome` in batch rows, for the
budget and the statistics, and the kept tokens per cache row, for the caches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .budget import RoundOutcome
from .history import RowHistory, stop_counts, to_batch

if TYPE_CHECKING:
    from .trees import Acceptance


@dataclass(frozen=True)
class RoundRows:
    """The rows at a round's start (host lists): per batch row, the tokens it may still add (``remaining``) and
    whether it is ``unfinished``; per cache row, the drafts it could keep (``room``: its remaining less the
    target's own token) and ``unfinished_in_cache``."""

    remaining: list[int]
    unfinished: list[bool]
    room: list[int]
    unfinished_in_cache: list[bool]


@dataclass(frozen=True)
class KeptRows:
    """What the rows kept of a round, in each numbering once: ``outcome`` per batch row (host lists: the tokens
    kept, 0 once finished, the drafts accepted and drafted, ...), ``in_cache`` [A]: the tokens kept per cache row
    (a tensor on the acceptance's device, for the caches' rollback)."""

    outcome: RoundOutcome
    in_cache: torch.Tensor


class Rows:
    """Rows advance by different amounts per round; each keeps exactly the tokens plain generate would."""

    def __init__(self, input_ids: torch.Tensor, max_length: int, pad_id: int, stopping_criteria: Any,
                 streamer: Any = None):
        self.history = RowHistory(input_ids, max_length + 2, pad_id)
        self.max_length, self.pad_id = max_length, pad_id
        self.stopping_criteria, self.streamer = stopping_criteria, streamer
        self.batch_size = input_ids.shape[0]
        self.unfinished = [True] * self.batch_size
        self.in_cache = list(range(self.batch_size))  # host: the batch row of each cache row
        self.cache_index: torch.Tensor | None = None  # the same on the device; None while every row is in

    def any_unfinished(self) -> bool:
        return any(self.unfinished)

    # ---- batch rows <-> cache rows -----------------------------------------------------------------------
    def to_batch(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [A, ...] per cache row as [B, ...] per batch row (zeros for rows out of the caches)."""
        return to_batch(x, self.cache_index, self.batch_size)

    def to_cache(self, values: list) -> list:
        """A per-batch-row list, for the cache rows."""
        return [values[r] for r in self.in_cache]

    def leaving(self) -> list[int] | None:
        """Cache rows to keep if finished rows should leave the caches now, else None. Leaving copies
        every cache once, so rows leave in groups of at least a quarter of the rows still in them."""
        keep = [a for a, r in enumerate(self.in_cache) if self.unfinished[r]]  # host lists: no device sync
        if len(self.in_cache) - len(keep) >= max(1, len(self.in_cache) // 4):
            return keep
        return None

    def leave(self, keep: list[int], device: torch.device) -> torch.Tensor:
        """Only the cache rows ``keep`` stay in the caches; returns them as a tensor for the caches' own
        ``select_rows``."""
        self.in_cache = [self.in_cache[a] for a in keep]
        self.cache_index = torch.tensor(self.in_cache, device=device)
        return torch.tensor(keep, device=device)

    def remaining(self) -> list[int]:
        """Tokens each row may still add before ``max_length``."""
        return [self.max_length - length for length in self.history.lengths]

    def start_round(self) -> RoundRows:
        remaining, unfinished = self.remaining(), list(self.unfinished)
        return RoundRows(remaining, unfinished, self.to_cache([r - 1 for r in remaining]), self.to_cache(unfinished))

    def keep(self, accepted: "Acceptance", drafted: torch.Tensor, start: RoundRows, gamma: int,
             tree: Any = None) -> KeptRows:
        """Offer each cache row's emitted tokens (none for a finished row) to the stopping criteria, as the batch
        rows they are (:meth:`emit`); ``drafted`` [A]: drafts each cache row proposed, ``gamma`` the round's depth,
        ``tree`` its :class:`~hf_specmm.trees.DraftTree` (None: a chain)."""
        unfinished = torch.tensor(start.unfinished_in_cache, device=accepted.n.device)
        kept = self.emit(self.to_batch(accepted.emitted), self.to_batch(accepted.offered(unfinished)))
        # ended: stopped in the round before max_length (EOS, a stop string or another stopping criterion)
        ended = [u and not now and k < r for u, now, k, r in zip(start.unfinished, self.unfinished, kept,
                                                                 start.remaining)]
        outcome = RoundOutcome(gamma, start.unfinished, kept, self.to_batch(accepted.n).tolist(),
                               self.to_batch(drafted).tolist(), ended, self.remaining(), list(self.unfinished),
                               self.tree_paths(tree, accepted) if tree is not None else None)
        return KeptRows(outcome, accepted.n.new_tensor(self.to_cache(kept)))

    def tree_paths(self, tree: Any, accepted: "Acceptance") -> Callable[[], list[list[tuple[int, int]]]]:
        """Per batch row, computed when called: (valid children, rank of the next path node among them) of each
        node on the row's accepted tree path (one device transfer)."""
        in_cache, batch = list(self.in_cache), self.batch_size

        def paths() -> list[list[tuple[int, int]]]:
            parents, valid, path = tree.parents, tree.valid, accepted.path.to(tree.parents.device)
            nodes = torch.arange(parents.shape[1], device=parents.device)
            child_of = (parents[:, None, :] == path[:, :, None]) & valid[:, None, :] & (nodes > 0)  # [A, D+1, N+1]
            counts = child_of.sum(-1).tolist()
            ranks = (child_of[:, :-1] & (nodes[None, None, :] < path[:, 1:, None])).sum(-1).tolist()
            out: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
            for a, b in enumerate(in_cache):
                out[b] = [(c, r) for c, r in zip(counts[a], ranks[a] + [0])]
            return out
        return paths

    def emit(self, block: torch.Tensor, counts: torch.Tensor) -> list[int]:
        """Offer ``counts`` [B] tokens of ``block`` [B, m] per row; returns how many each row kept."""
        self.history.write(block)
        kept, stopped = stop_counts(self.stopping_criteria, self.history, block, counts)
        self.history.advance(kept)
        for i in range(len(kept)):
            if stopped[i]:
                self.unfinished[i] = False
        if self.streamer is not None and kept[0]:
            self.streamer.put(block[:, : kept[0]].cpu())
        return kept

    def sequences(self) -> torch.Tensor:
        """[B, P0 + new] laid out as plain generate's: rows that finished early are padded."""
        total = max(self.history.lengths)
        sequences = self.history.ids[:, :total].clone()
        for i, length in enumerate(self.history.lengths):
            sequences[i, length:] = self.pad_id
        return sequences
