"""Each row's token history exactly as plain ``generate`` would show it to logits processors and
stopping criteria, although rows advance by different amounts per round.

Plain batched generate keeps rows in lock-step, so a processor at step t sees ``input_ids[:, :P0+t]``.
Here row i may be ahead of row j. Processors may hold per-row state (the repetition penalty keeps each
row's padding length), so they are always called on the whole batch: once per distinct history
length, keeping the output rows whose history has that length. Processors that ignore the history
(temperature, top-k, ...) are applied to the whole block in one call.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation import (
    EosTokenCriteria,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MaxLengthCriteria,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

# processors whose output depends only on the scores row, never on the token history or batch index
HISTORY_FREE_PROCESSORS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


class RowHistory:
    """Token ids per row, left-aligned like plain generate's ``input_ids`` (prompt padding included)."""

    def __init__(self, input_ids: torch.Tensor, capacity: int, pad_id: int):
        batch, prompt_len = input_ids.shape
        self.ids = input_ids.new_full((batch, max(capacity, prompt_len) + 1), pad_id)
        self.ids[:, :prompt_len] = input_ids
        self.lengths = [prompt_len] * batch  # host ints: used for grouping and slicing
        self.prompt_len = prompt_len

    def write(self, block: torch.Tensor, offset: int = 0, rows: torch.Tensor | None = None) -> None:
        """Tentatively write ``block`` [B, m] at ``offset`` after each row's history (later writes overwrite it);
        ``rows`` [A]: ``block`` holds only these batch rows ([A, m])."""
        start = torch.tensor(self.lengths, device=block.device)[:, None] + offset
        if rows is not None:
            start = start[rows.to(block.device)]
        cols = start + torch.arange(block.shape[1], device=block.device)
        cols = cols.clamp_max(self.ids.shape[1] - 1)
        if rows is None:
            self.ids.scatter_(1, cols, block)
        else:
            index = rows.to(self.ids.device)
            self.ids[index] = self.ids[index].scatter(1, cols.to(self.ids.device), block.to(self.ids.device))

    def advance(self, counts: list[int]) -> None:
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]

    def groups(self) -> list[tuple[int, list[int]]]:
        by_length: dict[int, list[int]] = {}
        for i in range(len(self.lengths)):
            by_length.setdefault(self.lengths[i], []).append(i)
        return sorted(by_length.items())

    def generated(self, row: int) -> torch.Tensor:
        return self.ids[row, self.prompt_len : self.lengths[row]]


def to_batch(x: torch.Tensor, rows: torch.Tensor | None, batch: int) -> torch.Tensor:
    """``x`` [A, ...] of the batch rows ``rows`` [A] (the rows still in the caches) as a [batch, ...] tensor,
    zeros for the other rows; ``x`` itself when ``rows`` is None (every row)."""
    if rows is None:
        return x
    return x.new_zeros((batch, *x.shape[1:])).index_copy_(0, rows.to(x.device), x)


def _call(processors: Any, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``LogitsProcessorList.__call__`` without its per-call ``inspect.signature`` of every processor
    (measurable at γ+1 target and γ draft calls per round); we pass no extra kwargs anyway."""
    for processor in processors:
        scores = processor(input_ids, scores)
    return scores


def apply_processors(processors: Any, history: RowHistory, logits: torch.Tensor, offset: int = 0,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """Processed scores for a block: position j of row i sees its history plus the ``offset + j`` tokens
    written after it with :meth:`RowHistory.write`. ``logits`` [B, m, V] float32, or [A, m, V] for the batch
    rows ``rows`` [A] only (rows that finished left the caches)."""
    if processors is None or len(processors) == 0:
        return logits
    batch, width, vocab = logits.shape
    if all(type(p) in HISTORY_FREE_PROCESSORS for p in processors):
        flat = _call(processors, history.ids[:1].expand(batch * width, -1), logits.reshape(batch * width, vocab).clone())
        return flat.view(batch, width, vocab)
    if rows is not None:  # processors may keep per-row state (padding lengths): they see the whole batch
        full = to_batch(logits, rows, history.ids.shape[0])
        return apply_processors(processors, history, full, offset)[rows.to(logits.device)]
    out = torch.empty_like(logits)
    for length, members in history.groups():
        index = torch.tensor(members, device=logits.device)
        for j in range(width):
            full = _call(processors, history.ids[:, : length + offset + j], logits[:, j].clone())
            out[index, j] = full[index]
    return out


def stop_counts(criteria: Any, history: RowHistory, emitted: torch.Tensor, counts: torch.Tensor) -> tuple[list[int], list[bool]]:
    """How many of each row's ``counts`` new tokens (in ``emitted`` [B, m]) plain generate would keep,
    and whether the row stops. ``emitted`` must already be written into ``history``."""
    counts_host = counts.tolist()
    kept, stopped = list(counts_host), [False] * len(counts_host)
    simple = all(type(c) in (MaxLengthCriteria, EosTokenCriteria) for c in criteria)
    if simple:
        width = emitted.shape[1]
        hit = torch.zeros_like(emitted, dtype=torch.bool)
        for c in criteria:
            if isinstance(c, EosTokenCriteria):
                hit |= torch.isin(emitted, c.eos_token_id.to(emitted.device))
        first_eos = torch.where(hit.any(-1), hit.long().argmax(-1), torch.full_like(counts, width)).tolist()
        max_len = min((c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)), default=None)
        for i, (n, length) in enumerate(zip(counts_host, history.lengths)):
            limit = n
            if first_eos[i] < n:
                limit = first_eos[i] + 1
            if max_len is not None and length + limit >= max_len:
                limit = max(0, min(limit, max_len - length))
                stopped[i] = True
            if limit < n or first_eos[i] < n:
                stopped[i] = True
            kept[i] = limit
        return kept, stopped
    for length, rows in history.groups():
        index = torch.tensor(rows, device=emitted.device)
        longest = max(counts_host[i] for i in rows)
        done = torch.zeros(len(rows), dtype=torch.bool, device=emitted.device)
        flags = []
        for j in range(longest):
            done = done | criteria(history.ids[:, : length + j + 1], None).to(done.device)[index]
            flags.append(done.clone())
        flags_host = torch.stack(flags, 1).tolist() if flags else [[] for _ in rows]
        for r, i in enumerate(rows):
            for j in range(counts_host[i]):
                if flags_host[r][j]:
                    kept[i], stopped[i] = j + 1, True
                    break
    return kept, stopped


def history_free(processors: Any) -> bool:
    """Whether every processor ignores the token history (then any block can be processed in one call)."""
    return processors is None or all(type(p) in HISTORY_FREE_PROCESSORS for p in processors)


def apply_processors_along_paths(processors: Any, history: RowHistory, logits: torch.Tensor, paths: torch.Tensor,
                                 depths: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Processed scores for positions that each continue their row's history with a path of their own (tree
    nodes): position k of row i sees the history plus ``paths[i, k, :depths[i, k]]``. ``logits`` [A, K, V],
    ``paths`` [A, K, D], ``depths`` [A, K]; ``rows`` as in :func:`apply_processors`."""
    if history_free(processors):
        return apply_processors(processors, history, logits, rows=rows)
    out = torch.empty_like(logits)
    depths_host = depths.tolist()
    for k in range(logits.shape[1]):
        for depth in sorted({row[k] for row in depths_host}):
            if depth:
                history.write(paths[:, k, :depth], rows=rows)  # tentative: later writes overwrite it
            scored = apply_processors(processors, history, logits[:, k : k + 1], offset=depth, rows=rows)
            chosen = depths[:, k] == depth
            out[chosen, k] = scored[chosen, 0]
    return out
