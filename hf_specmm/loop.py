"""The speculative decoding loop. Symbols: γ block size, d_1..d_γ drafts, q draft probabilities,
p_0..p_γ target distributions, n accepted drafts per row, τ tokens per target forward.

One round: the draft proposes d_1..d_γ (γ cheap forwards, its cache reused); the target scores
[cur, d_1..d_γ] in ONE forward; each row keeps n ≤ γ drafts plus one target token; both caches are
cropped back to the accepted prefix. Rows move at their own pace (see ``cache_state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import _compat
from .cache_state import SlottedCache
from .drafters import TextOnlyDrafter
from .history import RowHistory, apply_processors, stop_counts
from .stats import SpecStats
from .verify import greedy_verify, rejection_sample


@dataclass
class GammaSchedule:
    """``constant``: γ fixed. ``heuristic`` (as stock transformers): +2 after a round where every row
    accepted all drafts, else -1 (never below 1). Starts from the configured γ on every call."""

    gamma: int
    kind: str = "constant"

    def update(self, accepted: list[int], gamma_used: int) -> None:
        if self.kind == "heuristic" and accepted:
            self.gamma = self.gamma + 2 if min(accepted) == gamma_used else max(1, self.gamma - 1)


def _choose(scores: torch.Tensor, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not do_sample:
        return scores.argmax(-1), None
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1).squeeze(-1), probs


def speculative_decode(
    target: Any,
    drafter: TextOnlyDrafter,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    model_kwargs: dict,
    schedule: GammaSchedule,
    stats: SpecStats,
    streamer: Any = None,
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Returns ``sequences`` [B, P0 + new] laid out as plain generate's, and per-row processed scores."""
    batch, prompt_len = input_ids.shape
    do_sample = bool(generation_config.do_sample)
    pad = _compat.pad_token_tensor(generation_config)
    pad_id = int(pad) if pad is not None else 0
    keep_scores = bool(generation_config.return_dict_in_generate and
                       (generation_config.output_scores or generation_config.output_logits))
    history = RowHistory(input_ids, generation_config.max_length + 2, pad_id)
    row_scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    stats.batch_size, stats.gamma = batch, schedule.gamma

    def emit(block: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor) -> list[int]:
        history.write(block)
        kept, stopped = stop_counts(stopping_criteria, history, block, counts)
        history.advance(kept)
        for i, k in enumerate(kept):
            if keep_scores and k:
                row_scores[i].append(torch.stack([scores[i, :k], logits[i, :k]]))
            if stopped[i]:
                unfinished[i] = False
        stats.generated_tokens += sum(kept)
        if streamer is not None and kept[0]:
            streamer.put(block[:, : kept[0]].cpu())
        return kept

    # prefill: target exactly as plain generate (images included); draft on the text without placeholders
    attention_mask = model_kwargs.get("attention_mask")
    with drafter.observe_target(target):  # an adapter draft reads the target's image embeddings here
        out = _compat.prefill(target, input_ids, generation_config, model_kwargs)
    target_kv = SlottedCache(out.past_key_values, None if attention_mask is None else attention_mask.long(),
                             prompt_len, batch, input_ids.device)
    logits = out.logits[:, -1:].to(dtype=torch.float32, device=input_ids.device)
    del out
    scores = apply_processors(logits_processor, history, logits)
    cur, _ = _choose(scores[:, 0], do_sample)
    unfinished = [True] * batch
    stats.target_forwards += batch
    emit(cur[:, None], torch.ones_like(cur), scores, logits)
    if any(unfinished):
        drafter.prefill(input_ids, attention_mask)
        drafter.push(cur)

    def select(draft_logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        draft_scores = apply_processors(logits_processor, history, draft_logits[:, None], offset=j)[:, 0]
        token, q_j = _choose(draft_scores, do_sample)
        history.write(token[:, None], offset=j)  # d_{j+1} is history for the next positions
        return token, q_j

    while any(unfinished):
        budget = [generation_config.max_length - length for length in history.lengths]  # tokens a row may still add
        gamma = min(schedule.gamma, max(b for b, u in zip(budget, unfinished) if u) - 1)
        unfinished_before = list(unfinished)
        live = torch.tensor(unfinished, device=input_ids.device)

        if gamma > 0:
            drafts, q = drafter.propose(gamma, select)  # d_1..d_γ, q_1..q_γ
        else:  # one token left for every row: a plain target step ends the call
            drafts, q = cur.new_zeros(batch, 0), logits.new_zeros(batch, 0, logits.shape[-1])
        block = torch.cat([cur[:, None], drafts], dim=1)  # [cur, d_1..d_γ]
        inputs = target_kv.block_inputs(None, gamma + 1)
        out = target(input_ids=block, past_key_values=target_kv.cache, use_cache=True,
                     logits_to_keep=gamma + 1, **inputs)
        target_kv.commit(inputs["attention_mask"], gamma + 1)
        logits = out.logits[:, -(gamma + 1):].to(dtype=torch.float32, device=input_ids.device)
        del out
        scores = apply_processors(logits_processor, history, logits)  # p_0..p_γ (processed)

        if do_sample:
            n, emitted = rejection_sample(drafts, q, scores.softmax(-1))
        else:
            n, emitted = greedy_verify(drafts, scores)
        n = torch.where(live, n, torch.zeros_like(n))
        kept = emit(emitted, torch.where(live, n + 1, torch.zeros_like(n)), scores, logits)

        # roll back: each row keeps cur + its accepted drafts; finished rows keep nothing new
        n_host = [k - 1 if unfinished[i] else 0 for i, k in enumerate(kept)]
        n_keep = torch.tensor(n_host, device=input_ids.device)
        valid = torch.arange(max(n_host) + 1, device=input_ids.device)[None] <= n_keep[:, None]
        target_kv.rollback(target_kv.length - (gamma + 1), valid)
        cur = emitted.gather(1, n_keep[:, None]).squeeze(1)
        if gamma > 0:
            drafter.accept(n_keep, drafts, cur)

        # a draft counts only if the row could have kept it (not past max_length)
        useful = [min(gamma, budget[i] - 1) if unfinished_before[i] else 0 for i in range(batch)]
        accepted = [n_host[i] for i in range(batch) if unfinished_before[i]]
        stats.target_forwards += len(accepted)
        stats.draft_forwards += gamma
        stats.drafted_tokens += sum(useful)
        stats.accepted_tokens += sum(min(a, u) for a, u in zip(n.tolist(), useful))
        stats.tokens_per_round.append(list(kept))
        stats.gammas.append(gamma)
        schedule.update(accepted, gamma)

    if streamer is not None:
        streamer.end()
    total = max(history.lengths)
    sequences = history.ids[:, :total].clone()
    for i, length in enumerate(history.lengths):
        sequences[i, length:] = pad_id
    return sequences, row_scores
