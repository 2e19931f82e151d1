"""The speculative decoding loop. Symbols: γ block size, d_1..d_γ drafts, q draft probabilities,
p_0..p_γ target distributions, n accepted drafts per row, k kept tokens, keep = k - 1 kept drafts,
τ tokens per target forward (the words are defined once, in :mod:`hf_specmm.trees.verify`; the picture of a
round is docs/round.md).

One round (:meth:`SpeculativeDecoding.round`, the one place a block is built, verified, accepted and
rolled back): the draft proposes d_1..d_γ (γ cheap forwards, its cache reused); the target scores the
block [cur, d_1..d_γ] in ONE forward; each row keeps ``keep`` ≤ n drafts plus one target token; both caches
keep the kept prefix. Rows move at their own pace (see :mod:`hf_specmm.caches.base`). ``prefill`` returns the
call's state (:class:`CallState`), which every ``round`` takes.

The seams, each a module of its own:

- the **budget** (:mod:`hf_specmm.budget`): how much a drafter may propose each round, asked once per call
  (``start``) and once at each round's end with its :class:`~hf_specmm.budget.RoundOutcome` (``close``, which
  returns the next round's);
- the **selector** (:mod:`hf_specmm.selector`): how a drafter picks a token (processors, choice, history);
- the **block** (:mod:`hf_specmm.block`): what the target verifies, writing its own mask and positions into
  the target's cache: a chain, or a draft tree (ancestor mask, positions by depth);
- the **verification rules**, plain functions the block calls for its shape, greedy or sampling
  (:mod:`hf_specmm.verifier`, :mod:`hf_specmm.trees`), and their :class:`~hf_specmm.trees.Acceptance`: per row,
  which block positions are kept (a tree's accepted root path: ``Acceptance.path``) and the next token;
- the **cache backend** (:mod:`hf_specmm.caches`): the target's and every drafter's caches come from one
  backend (dynamic today; a static backend keeps fixed shapes, so the round can be compiled);
- the **rows** (:mod:`hf_specmm.rows`): batch rows and the rows still in the caches, converted once per round
  each way (``Rows.start_round``, ``Rows.keep``): the budget and the statistics see batch rows only, the caches
  and the drafter cache rows only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _compat
from .block import block_of
from .budget import DraftBudget, RoundBudget, RoundOutcome
from .caches import DynamicBackend, SlottedCache
from .drafter import Drafter, Prompt, Proposal
from .history import apply_processors
from .outputs import GenerateOutputs
from .prompt_checks import check_left_padded
from .rows import Rows
from .selector import DraftSelector, choose
from .stats import SpecStats
from .targets import target_family


@dataclass
class CallState:
    """Everything one ``generate`` call's rounds read and write, made by :meth:`SpeculativeDecoding.prefill` and
    taken by :meth:`SpeculativeDecoding.round`: the target (``target_call``: its verification forward, compiled
    where the backend compiles) and its cache, the call's rows, selector, processors and outputs, ``do_sample``
    (which verification rules), and ``cur`` [A]: each cache row's current token (the first of its next block, the
    root of its next tree), kept here alone and handed to the drafter where it reads it."""

    target: Any
    target_call: Callable[..., Any]
    target_kv: SlottedCache
    rows: Rows
    select: DraftSelector
    do_sample: bool
    processors: Any
    outputs: GenerateOutputs
    cur: torch.Tensor
    vocab_size: int
    device: torch.device


class SpeculativeDecoding:
    """One ``generate`` call's decoding: built before stock ``generate`` runs, called by it as its decoding
    loop (``custom_generate``) with fully prepared inputs; afterwards :attr:`stats` and :attr:`budget` hold
    what the call measured and the γ it ended with.

    ``image_inputs``: the call's multimodal inputs as the user passed them (``pixel_values``, ...; stock
    ``generate`` may have encoded and dropped them from ``model_kwargs`` already), for drafts that see images.
    """

    def __init__(self, drafter: Drafter, budget: DraftBudget, streamer: Any = None,
                 image_inputs: dict[str, Any] | None = None, backend: Any = None):
        self.drafter, self.budget, self.streamer = drafter, budget, streamer
        self.image_inputs = dict(image_inputs or {})
        self.backend = backend if backend is not None else DynamicBackend()
        self.stats = SpecStats()

    def __call__(self, target: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                 generation_config: Any, **model_kwargs: Any) -> Any:
        """Returns ``sequences`` [B, P0 + new] laid out as plain generate's (or, with
        ``return_dict_in_generate``, a ``GenerateDecoderOnlyOutput`` with the scores / logits / attentions /
        hidden states asked for)."""
        graphs = _compat.compiled_graph_count()
        try:
            call = self.prefill(target, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
            next_round = self.budget.start(call.rows.remaining(), list(call.rows.unfinished))
            while call.rows.any_unfinished():
                if next_round is None:
                    raise RuntimeError(f"{type(self.budget).__name__} gave no round while rows are unfinished")
                outcome = self.round(call, next_round)
                self.drop_finished_rows(call)
                next_round = self.budget.close(outcome)  # the one budget call of a round, at its end
        finally:
            self.backend.close()  # linear-attention capture hooks come off the models
        self.stats.graphs_compiled = _compat.compiled_graph_count() - graphs
        if getattr(self.backend, "compile_config", None) is not None:  # dynamo may have given up on a frame: say so
            self.stats.recompile_limit_hits = _compat.recompile_limit_hits()
        if self.streamer is not None:
            self.streamer.end()
        if call.outputs.return_dict:
            return call.outputs.build(call.rows.sequences(), call.target_kv)
        return call.rows.sequences()

    def prefill(self, target: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                generation_config: Any, model_kwargs: dict) -> CallState:
        """The target's prefill exactly as plain generate's (images included), its first token, then the
        draft reads the prompt. Returns the state the call's rounds take."""
        batch, prompt_len = input_ids.shape
        device, do_sample = input_ids.device, bool(generation_config.do_sample)
        pad = _compat.pad_token_tensor(generation_config)
        rows = Rows(input_ids, generation_config.max_length, int(pad) if pad is not None else 0, stopping_criteria,
                    self.streamer)
        self.stats.batch_size, self.stats.gamma = batch, self.budget.gamma

        mask = model_kwargs.get("attention_mask")
        # the family's position rule bound to this prompt (M-RoPE grids; where stock continues a right-padded row)
        positions = target_family(target).positions.bind(target, input_ids, mask, model_kwargs)
        # right padding is followed where stock's prompt positions are known; windows count no moved holes
        if positions.offset is None or self.backend.requires_left_padding(target):
            check_left_padded(mask)
        self.backend.prepare_target(target, model_kwargs, generation_config, prompt_len, self.budget.gamma + 1)
        with self.drafter.watch(target):
            out = _compat.target_prefill(target, input_ids, generation_config, model_kwargs)
        self.drafter.observe_prefill(out)
        target_kv = self.backend.wrap_target(target, _compat.output_cache(out), mask, prompt_len, batch, device,
                                             positions)
        self.drafter.observe_target_cache(target_kv)
        outputs = GenerateOutputs(generation_config, batch, prompt_len, compacted=target_kv.compact)
        logits = out.logits[:, -1:].to(dtype=torch.float32, device=device)
        scores = apply_processors(logits_processor, rows.history, logits)
        cur, _ = choose(scores[:, 0], do_sample)  # the first new token, as plain generate picks it
        kept = rows.emit(cur[:, None], torch.ones_like(cur))
        outputs.record(out, kept, scores, logits, None, 0)
        self.stats.record_prefill(kept)
        del out
        if rows.any_unfinished():
            self.drafter.prefill(Prompt(input_ids, mask, self.image_inputs), cur, self.backend.new)
        return CallState(
            target=target,
            # the verification forward: compiled where the backend compiles, except for a drafter that hooks the
            # target's modules (a compiled graph does not run hooks added after it was traced)
            target_call=target if self.drafter.observes_verification else target_kv.step_call(target),
            target_kv=target_kv, rows=rows,
            select=DraftSelector(logits_processor, rows, do_sample, self.budget.confidence),
            do_sample=do_sample, processors=logits_processor, outputs=outputs, cur=cur,
            vocab_size=logits.shape[-1], device=device)

    def round(self, call: CallState, budget: RoundBudget) -> RoundOutcome:
        """Draft, verify, accept, roll back: one target forward, drafting what ``budget`` allows. Reads and advances
        ``call``; returns what the round did, per batch row (for the call's budget)."""
        rows, drafter, target_kv = call.rows, self.drafter, call.target_kv
        start_rows = rows.start_round()  # both numberings, once

        # 1. draft d_1..d_γ (γ = 0: one token left for every row, a plain target step ends the call);
        #    a confidence threshold may end a row's drafts early (its length) or the whole round
        call.select.start_round(budget.gamma, call.device)
        if budget.gamma > 0:
            proposal = drafter.propose(budget, call.select, call.cur)
        else:
            proposal = Proposal.empty(call.cur.shape[0], call.vocab_size, call.cur)
        gamma, lengths = proposal.gamma, call.select.round_lengths(proposal.gamma)

        # 2. verify: one target forward over the block [cur, d_1..d_γ] (or the tree rooted at cur) gives p_0..p_γ
        block = block_of(call.cur, proposal, call.target)
        target_kv.reserve(block.width)
        start = target_kv.length
        inputs = block.append_to(target_kv)
        with drafter.watch(call.target) if drafter.observes_verification else contextlib.nullcontext():
            out = call.target_call(input_ids=block.tokens, **target_kv.forward_kwargs(), use_cache=True,
                                   logits_to_keep=block.width, **inputs, **call.outputs.forward_kwargs())
        drafter.observe_verification(out)
        logits = out.logits[:, -block.width:].to(dtype=torch.float32, device=call.device)
        scores = block.scores(call.processors, rows.history, logits, rows.cache_index)  # p_0..p_γ

        # 3. accept n drafts + the bonus token per row; a row keeps what plain generate would (EOS, max_length)
        accepted = block.verify(proposal, scores, lengths, call.do_sample)
        kept = rows.keep(accepted, block.drafted(proposal, lengths, start_rows.room), start_rows, gamma, proposal.tree)
        outcome = kept.outcome  # batch rows
        call.outputs.record(out, outcome.kept, block.along_path(scores, accepted), block.along_path(logits, accepted),
                            target_kv, start)
        del out
        self.stats.record_round(gamma, outcome.kept, outcome.accepted, outcome.drafted, start_rows.remaining,
                                start_rows.unfinished, tree=block.is_tree)

        # 4. roll back both caches: each row keeps [cur, d_1..d_keep], keep = kept - 1; emitted[keep] is the new cur
        keep = (kept.in_cache - 1).clamp_min(0)
        target_kv.rollback(start, kept.in_cache, accepted.path)
        call.cur = accepted.token_at(keep)
        if gamma > 0:
            drafter.accept(proposal, keep, call.cur, accepted.path)
        elif rows.any_unfinished():  # a plain step mid-call (a budget may plan γ 0): the draft reads the token later
            drafter.follow(call.cur)
        return outcome

    def drop_finished_rows(self, call: CallState) -> None:
        """Finished rows leave both caches, so later rounds run only the others; not while every per-step
        output is kept for the whole batch (``return_dict_in_generate``) or the caches keep fixed shapes (static
        backend)."""
        if not self.backend.drops_rows or call.outputs.return_dict or not call.rows.any_unfinished():
            return
        keep_host = call.rows.leaving()
        if keep_host is None:
            return
        keep = call.rows.leave(keep_host, call.device)
        call.cur = call.cur[keep]
        call.target_kv.select_rows(keep)
        self.drafter.select_rows(keep)
