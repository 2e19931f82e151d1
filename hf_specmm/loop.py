"""The speculative decoding loop. Symbols: γ block size, d_1..d_γ drafts, q draft probabilities,
p_0..p_γ target distributions, n accepted drafts per row, τ tokens per target forward.

One round (:meth:`SpeculativeDecoding.round`, the one place a block is built, verified, accepted and
rolled back): the draft proposes d_1..d_γ (γ cheap forwards, its cache reused); the target scores the
block [cur, d_1..d_γ] in ONE forward; each row keeps n ≤ γ drafts plus one target token; both caches
keep the accepted prefix. Rows move at their own pace (see :mod:`hf_specmm.caches.base`).

The seams, each an object of its own:

- the **budget** (:mod:`hf_specmm.budget`): how much a drafter may propose this round;
- the **selector** (:mod:`hf_specmm.selector`): how a drafter picks a token (processors, choice, history);
- the **block** (:mod:`hf_specmm.block`): what the target verifies, writing its own mask and positions into
  the target's cache. A draft tree is one more block shape (ancestor mask, positions by depth);
- the **verifier** and its **acceptance** (:mod:`hf_specmm.verifier`, :class:`~hf_specmm.trees.Acceptance`): per row, which block positions are kept
  (a tree's accepted root path: ``Acceptance.path``) and the next token;
- the **cache backend** (:mod:`hf_specmm.caches`): the target's and every drafter's caches come from one
  backend (dynamic today; a static backend keeps fixed shapes, so the round can be compiled);
- the **rows** (:mod:`hf_specmm.rows`): batch rows and the rows still in the caches, both ways.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import _compat
from .block import block_of
from .budget import DraftBudget
from .caches import DynamicBackend
from .drafter import Drafter, Prompt, Proposal
from .history import apply_processors
from .outputs import GenerateOutputs
from .prompt_checks import check_left_padded
from .rows import Rows
from .selector import DraftSelector, choose
from .stats import SpecStats
from .targets import target_family
from .verifier import verifier_for


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
            self.prefill(target, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
            while self.rows.any_unfinished():
                self.round()
                self.drop_finished_rows()
        finally:
            self.backend.close()  # linear-attention capture hooks come off the models
        self.stats.graphs_compiled = _compat.compiled_graph_count() - graphs
        if getattr(self.backend, "compile_config", None) is not None:  # dynamo may have given up on a frame: say so
            self.stats.recompile_limit_hits = _compat.recompile_limit_hits()
        if self.streamer is not None:
            self.streamer.end()
        if self.outputs.return_dict:
            return self.outputs.build(self.rows.sequences(), self.target_kv)
        return self.rows.sequences()

    def prefill(self, target: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                generation_config: Any, model_kwargs: dict) -> None:
        """The target's prefill exactly as plain generate's (images included), its first token, then the
        draft reads the prompt."""
        batch, prompt_len = input_ids.shape
        self.target, self.processors, self.device = target, logits_processor, input_ids.device
        self.do_sample = bool(generation_config.do_sample)
        pad = _compat.pad_token_tensor(generation_config)
        self.rows = Rows(input_ids, generation_config.max_length, int(pad) if pad is not None else 0,
                         stopping_criteria, self.streamer)
        self.select = DraftSelector(logits_processor, self.rows, self.do_sample, self.budget.confidence)
        self.verifier = verifier_for(self.do_sample)
        self.stats.batch_size, self.stats.gamma = batch, self.budget.gamma

        mask = model_kwargs.get("attention_mask")
        # the family's position rule bound to this prompt (M-RoPE grids; where stock continues a right-padded row)
        positions = target_family(target).positions.bind(target, input_ids, mask, model_kwargs)
        # right padding is followed where stock's prompt positions are known; windows count no moved holes
        if positions.offset is None or self.backend.requires_left_padding(target):
            check_left_padded(mask)
        self.backend.prepare_target(target, model_kwargs, generation_config, prompt_len, self.budget.gamma + 1)
        with self.drafter.watch(target):
            out = _compat.prefill(target, input_ids, generation_config, model_kwargs)
        self.drafter.observe_prefill(out)
        self.target_kv = self.backend.wrap_target(target, _compat.output_cache(out), mask, prompt_len, batch,
                                                  self.device, positions)
        # the verification forward: compiled where the backend compiles, except for a drafter that hooks the
        # target's modules (a compiled graph does not run hooks added after it was traced)
        self.target_call = target if self.drafter.observes_verification else self.target_kv.step_call(target)
        self.outputs = GenerateOutputs(generation_config, batch, prompt_len, compacted=self.target_kv.compact)
        logits = out.logits[:, -1:].to(dtype=torch.float32, device=self.device)
        scores = apply_processors(logits_processor, self.rows.history, logits)
        self.cur, _ = choose(scores[:, 0], self.do_sample)  # the first new token, as plain generate picks it
        kept = self.rows.emit(self.cur[:, None], torch.ones_like(self.cur))
        self.outputs.record(out, kept, scores, logits, None, 0)
        self.stats.record_prefill(kept)
        self.vocab_size = logits.shape[-1]
        del out
        if self.rows.any_unfinished():
            self.drafter.prefill(Prompt(input_ids, mask, self.image_inputs), self.cur, self.backend.new)

    def round(self) -> None:
        """Draft, verify, accept, roll back: one target forward."""
        rows, drafter, target_kv = self.rows, self.drafter, self.target_kv
        remaining, unfinished = rows.budget(), list(rows.unfinished)
        budget = self.budget.for_round(remaining, unfinished)

        # 1. draft d_1..d_γ (γ = 0: one token left for every row, a plain target step ends the call);
        #    a confidence threshold may end a row's drafts early (its length) or the whole round
        self.select.start_round(budget.gamma, self.device)
        if budget.gamma > 0:
            proposal = drafter.propose(budget, self.select)
        else:
            proposal = Proposal.empty(self.cur.shape[0], self.vocab_size, self.cur)
        self.budget.drafted()
        gamma, lengths = proposal.gamma, self.select.round_lengths(proposal.gamma)

        # 2. verify: one target forward over the block [cur, d_1..d_γ] gives p_0..p_γ
        block = block_of(self.cur, proposal, self.target)  # a chain, or a draft tree
        target_kv.reserve(block.width)
        start = target_kv.length
        inputs = block.append_to(target_kv)
        with drafter.watch(self.target) if drafter.observes_verification else contextlib.nullcontext():
            out = self.target_call(input_ids=block.tokens, **target_kv.forward_kwargs(), use_cache=True,
                                   logits_to_keep=block.width, **inputs, **self.outputs.forward_kwargs())
        drafter.observe_verification(out)
        logits = out.logits[:, -block.width:].to(dtype=torch.float32, device=self.device)
        scores = block.scores(self.processors, rows.history, logits, rows.cache_index)  # p_0..p_γ

        # 3. accept n drafts + one target token per row; a row keeps what plain generate would (EOS, max_length)
        accepted = block.verify(self.verifier, proposal, scores, lengths)
        offered = accepted.offered(rows.unfinished_in_cache(self.device))
        kept = rows.emit(rows.to_batch(accepted.emitted), rows.to_batch(offered))  # [B] host ints
        self.outputs.record(out, kept, block.along_path(scores, accepted), block.along_path(logits, accepted),
                            target_kv, start)
        del out
        proposed = rows.to_batch(block.drafted(proposal, lengths, rows.to_cache([r - 1 for r in remaining]))).tolist()
        self.stats.record_round(gamma, kept, rows.to_batch(accepted.n).tolist(), proposed, remaining, unfinished,
                                tree=block.is_tree)
        self.budget.observe(proposal, accepted, rows.to_cache(unfinished))
        self.budget.update(kept, gamma)

        # 4. roll back both caches: each row keeps [cur, d_1..d_keep], keep = kept - 1; emitted[keep] is the new cur
        kept_in_cache = accepted.n.new_tensor(rows.to_cache(kept))  # 0 for a finished row: it keeps no slot
        keep = (kept_in_cache - 1).clamp_min(0)
        target_kv.rollback(start, kept_in_cache, accepted.path)
        self.cur = accepted.token_at(keep)
        if gamma > 0:
            block.accept(drafter, proposal, keep, self.cur, accepted)
        elif rows.any_unfinished():  # a plain step mid-call (hf_specmm.Auto): the draft reads the token later
            drafter.follow(self.cur)

    def drop_finished_rows(self) -> None:
        """Finished rows leave both caches, so later rounds run only the others; not while every per-step
        output is kept for the whole batch (``return_dict_in_generate``), the drafter keeps all its rows or the
        caches keep fixed shapes (static backend)."""
        if not (self.backend.drops_rows and self.drafter.selects_rows) or self.outputs.return_dict \
                or not self.rows.any_unfinished():
            return
        keep_host = self.rows.leaving()
        if keep_host is None:
            return
        keep = self.rows.leave(keep_host, self.device)
        self.cur = self.cur[keep]
        self.target_kv.select_rows(keep)
        self.drafter.select_rows(keep)
