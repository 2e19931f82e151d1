"""The speculative decoding loop. Symbols: γ block size, d_1..d_γ drafts, q draft probabilities,
p_0..p_γ target distributions, n accepted drafts per row, τ tokens per target forward.

One round: the draft proposes d_1..d_γ (γ cheap forwards, its cache reused); the target scores
[cur, d_1..d_γ] in ONE forward; each row keeps n ≤ γ drafts plus one target token; both caches are
cropped back to the accepted prefix. Rows move at their own pace (see ``cache_state``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from . import _compat
from .cache_state import SlottedCache
from .drafter import Drafter, Prompt, Proposal
from .history import apply_processors, to_batch
from .outputs import GenerateOutputs
from .prompt_checks import check_left_padded
from .rows import Rows
from .stats import SpecStats
from .targets import target_family
from .verify import greedy_verify, rejection_sample


@dataclass
class GammaSchedule:
    """``constant``: γ fixed. ``heuristic`` / ``heuristic_transient`` (as stock transformers): +2 after a
    round where every row accepted all drafts, else -1 (never below 1). ``heuristic`` also writes the
    final γ back to the draft's ``generation_config`` after the call, as stock does, so the next call
    starts from it; ``heuristic_transient`` starts from the configured γ on every call."""

    gamma: int
    kind: str = "constant"
    confidence: float | None = None  # assistant_confidence_threshold: a row stops drafting below it

    def update(self, accepted: list[int], gamma_used: int) -> None:
        if self.kind.startswith("heuristic") and accepted:
            self.gamma = self.gamma + 2 if min(accepted) == gamma_used else max(1, self.gamma - 1)


def _choose(scores: torch.Tensor, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not do_sample:
        return scores.argmax(-1), None
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1).squeeze(-1), probs


class DraftSelector:
    """Turns the draft's logits at step j into d_{j+1}, through the processors the target's tokens go
    through (q_j is then the processed draft distribution), and applies ``assistant_confidence_threshold``
    per row as stock does for its one row: a row whose chosen draft token has probability below the
    threshold keeps that token and drafts no more this round (``lengths``); ``stop`` once every row has."""

    def __init__(self, processors: Any, rows: Rows, do_sample: bool, threshold: float | None):
        self.processors, self.rows, self.do_sample, self.threshold = processors, rows, do_sample, threshold
        self.lengths: torch.Tensor | None = None  # [A] drafts each row in the caches proposes this round
        self.stop = False
        self.active: torch.Tensor | None = None  # [A] batch rows still in the caches (None: all of them)

    def start_round(self, active: torch.Tensor | None, rows_in: int, gamma: int, device: torch.device) -> None:
        self.active = active
        self.lengths = torch.full((rows_in,), gamma, device=device) if self.threshold is not None else None
        self.stop = False

    def __call__(self, draft_logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        draft_scores = apply_processors(self.processors, self.rows.history, draft_logits[:, None], offset=j,
                                        rows=self.active)[:, 0]
        token, q_j = _choose(draft_scores, self.do_sample)
        self.rows.history.write(token[:, None], offset=j, rows=self.active)  # history for later positions
        if self.lengths is not None:
            probs = q_j if q_j is not None else draft_scores.softmax(-1)
            unsure = probs.gather(1, token[:, None]).squeeze(1) < self.threshold
            drafting = self.lengths > j
            self.lengths = torch.where(drafting & unsure, torch.full_like(self.lengths, j + 1), self.lengths)
            self.stop = not bool((self.lengths > j + 1).any())
        return token, q_j


def speculative_decode(
    target: Any,
    drafter: Drafter,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    model_kwargs: dict,
    schedule: GammaSchedule,
    stats: SpecStats,
    streamer: Any = None,
    image_inputs: dict[str, Any] | None = None,
) -> Any:
    """Returns ``sequences`` [B, P0 + new] laid out as plain generate's (or, with ``return_dict_in_generate``,
    a ``GenerateDecoderOnlyOutput`` with the scores / logits / attentions / hidden states asked for).
    ``image_inputs``: the call's multimodal inputs as the user passed them (``pixel_values``, ...; stock
    ``generate`` may have encoded and dropped them from ``model_kwargs`` already), for drafts that see images."""
    batch, prompt_len = input_ids.shape
    device, do_sample = input_ids.device, bool(generation_config.do_sample)
    pad = _compat.pad_token_tensor(generation_config)
    rows = Rows(input_ids, generation_config.max_length, int(pad) if pad is not None else 0, stopping_criteria,
                streamer)
    sliding = _compat.has_sliding_layers(target.config)  # full cache layers, holes moved left (cache_state)
    outputs = GenerateOutputs(generation_config, batch, prompt_len, compacted=sliding)
    stats.batch_size, stats.gamma = batch, schedule.gamma

    select = DraftSelector(logits_processor, rows, do_sample, schedule.confidence)

    # prefill: the target exactly as plain generate (images included), then the draft reads the prompt
    attention_mask = model_kwargs.get("attention_mask")
    family = target_family(target)
    prompt = Prompt(input_ids, attention_mask, dict(image_inputs or {}))
    # the family's position rule bound to this prompt (M-RoPE grids; where stock continues a right-padded row)
    positions = family.positions.bind(target, input_ids, attention_mask, model_kwargs)
    # right padding is followed where stock's prompt positions are known, and windows count no moved holes
    if positions.offset is None or sliding:
        check_left_padded(attention_mask)
    if sliding:  # full layers, so rejected tokens can be cropped at any length (see cache_state)
        model_kwargs[_compat.CACHE_KWARG] = _compat.new_dynamic_cache()
    with drafter.watch(target):
        out = _compat.prefill(target, input_ids, generation_config, model_kwargs)
    drafter.observe_prefill(out)
    target_kv = SlottedCache(_compat.output_cache(out), None if attention_mask is None else attention_mask.long(),
                             prompt_len, batch, device, positions, compact=sliding)
    logits = out.logits[:, -1:].to(dtype=torch.float32, device=device)
    scores = apply_processors(logits_processor, rows.history, logits)
    cur, _ = _choose(scores[:, 0], do_sample)  # the first new token, as plain generate picks it
    kept = rows.emit(cur[:, None], torch.ones_like(cur))
    outputs.record(out, kept, scores, logits, None, 0)
    stats.record_prefill(kept)
    del out
    if rows.any_unfinished():
        drafter.prefill(prompt, cur)

    # finished rows leave both caches (later rounds run only the others) unless every per-step output is
    # kept for the whole batch (return_dict_in_generate) or the drafter keeps all its rows
    drops_rows = drafter.selects_rows and not outputs.return_dict
    active: torch.Tensor | None = None  # [A] batch rows in the caches, in cache order (None: all B rows)
    in_cache = list(range(batch))  # the same on the host

    while rows.any_unfinished():
        budget, unfinished = rows.budget(), list(rows.unfinished)
        live = torch.tensor([unfinished[r] for r in in_cache], device=device)  # [A]
        gamma = min(schedule.gamma, max(b for b, u in zip(budget, unfinished) if u) - 1)

        # 1. draft d_1..d_γ (with one token left for every row, a plain target step ends the call);
        #    a confidence threshold may end a row's drafts early (select.lengths) or the whole round
        select.start_round(active, cur.shape[0], gamma, device)
        if gamma > 0:
            proposal = drafter.propose(gamma, select)
        else:
            proposal = Proposal(cur.new_zeros(cur.shape[0], 0), logits.new_zeros(cur.shape[0], 0, logits.shape[-1]))
        drafts, gamma = proposal.tokens, proposal.gamma
        lengths = None if select.lengths is None or gamma == 0 else select.lengths.clamp_max(gamma)

        # 2. verify: one target forward over [cur, d_1..d_γ] gives p_0..p_γ
        block = torch.cat([cur[:, None], drafts], dim=1)
        inputs = target_kv.block_inputs(None, gamma + 1)
        with drafter.watch(target) if drafter.observes_verification else contextlib.nullcontext():
            out = target(input_ids=block, **_compat.cache_kwargs(target_kv.cache), use_cache=True,
                         logits_to_keep=gamma + 1, **inputs, **outputs.forward_kwargs())
        drafter.observe_verification(out)
        target_kv.commit(inputs["attention_mask"], gamma + 1)
        logits = out.logits[:, -(gamma + 1):].to(dtype=torch.float32, device=device)
        scores = apply_processors(logits_processor, rows.history, logits, rows=active)  # p_0..p_γ

        # 3. accept n drafts + one target token per row; a row keeps what plain generate would (EOS, max_length)
        if do_sample:
            n, emitted = rejection_sample(drafts, proposal.probs, scores.softmax(-1), lengths=lengths)
        else:
            n, emitted = greedy_verify(drafts, scores, lengths=lengths)
        offered = torch.where(live, n + 1, torch.zeros_like(n))
        kept = rows.emit(to_batch(emitted, active, batch), to_batch(offered, active, batch))  # [B] host ints
        outputs.record(out, kept, scores, logits, target_kv.mask, target_kv.length - (gamma + 1))
        del out
        # a draft counts as drafted only if its row could have kept it (not past max_length, not after an
        # accepted EOS: a row that stopped at its k-th accepted draft had k drafts that counted)
        per_row = [gamma] * batch if lengths is None else to_batch(lengths, active, batch).tolist()
        n_host = to_batch(n, active, batch).tolist()
        drafted = [min(g, b - 1, k if k <= a else g) if u else 0
                   for g, b, u, k, a in zip(per_row, budget, unfinished, kept, n_host)]
        accepted = [min(a, k, d) for a, k, d in zip(n_host, kept, drafted)]
        stats.record_round(gamma, kept, accepted, drafted)
        schedule.update([k - 1 for k in kept if k], gamma)

        # 4. roll back both caches: each row keeps [cur, d_1..d_m], m = kept - 1; emitted[m] is the new cur
        m = (n.new_tensor([kept[r] for r in in_cache]) - 1).clamp_min(0)
        valid = torch.arange(int(m.max()) + 1, device=device)[None] <= m[:, None]
        target_kv.rollback(target_kv.length - (gamma + 1), valid)
        cur = emitted.gather(1, m[:, None]).squeeze(1)
        if gamma > 0:
            drafter.accept(proposal, m, cur)

        # 5. rows that finished leave both batches: later rounds run only the others. Leaving copies both
        #    caches once, so rows leave in groups of at least a quarter of the rows still in them
        if drops_rows and rows.any_unfinished():
            keep_host = [k for k, r in enumerate(in_cache) if rows.unfinished[r]]  # host lists: no device sync
            if len(in_cache) - len(keep_host) >= max(1, len(in_cache) // 4):
                in_cache = [in_cache[k] for k in keep_host]
                keep, active = torch.tensor(keep_host, device=device), torch.tensor(in_cache, device=device)
                cur = cur[keep]
                target_kv.select_rows(keep)
                drafter.select_rows(keep)

    if streamer is not None:
        streamer.end()
    if outputs.return_dict:
        return outputs.build(rows.sequences(), target_kv.cache, target_kv.mask)
    return rows.sequences()
