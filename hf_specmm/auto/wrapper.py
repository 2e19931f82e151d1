"""``hf_specmm.Auto``: each round takes the shape (plain step, chain, tree) that its recent rounds and its prior
say is fastest on the machine at hand (docs/auto.md)."""

from __future__ import annotations

import os
import weakref
from typing import Any, Sequence

import torch

from ..budget import CallContext, DraftBudget
from ..drafts.wrapper import DraftWrapper, Tree
from ..errors import UnsupportedGenerationError
from ..trees.expand import TreeShape
from .acceptance import AcceptanceTable, check_profile
from .budget import AutoBudget
from .shapes import MAX_DEPTH, candidates, parse_shapes
from .store import COSTS, check_path, cost_key, model_name

#: the learned acceptance per (target, draft) pair, weakly held: {target: {draft: {sampling: AcceptanceTable}}}
_ACCEPTANCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Auto(DraftWrapper):
    """Wraps any draft (text-only, image-adapter, vlm, feature head, ``TextOnly(...)``) so that every round
    drafts the shape with the highest estimated tokens per second: a plain target step, a chain of γ ≤
    ``max_depth`` or a tree of the grid (≤ ``max_tokens`` nodes); a whole call runs as plain ``generate`` where that
    is estimated fastest. Acceptance by depth and rank is learned from every round, per (target, draft) pair,
    greedy and sampling apart (``prior``: a profile ``prior[d][r]`` as ``hf-specmm world-tau --profile`` writes, to
    start from); costs per (target, draft, device, dtype, batch bucket, cache kind), for the process and, with
    ``costs_file``, across processes (read and checked before the first forward, merged into the file after each
    call). The rule and its constants: docs/auto.md.

    Outputs are those of plain ``generate``: each round is verified as a fixed chain or tree would be (greedy
    identical; sampling keeps the target's distribution: a round's shape depends only on earlier rounds).
    ``last_stats(model).auto`` reports the shapes taken and the predicted and measured tokens per second.
    ``shapes``: rounds take these shapes in turn instead (ints 0..``MAX_DEPTH``: chains, 0 a plain step;
    ``TreeShape``: trees), for tests and for measuring an acceptance profile.

    Refused before any work, naming the option: ``num_assistant_tokens`` (use ``max_depth``),
    ``num_assistant_tokens_schedule`` other than ``'constant'``, ``assistant_confidence_threshold``,
    ``cache_implementation='static'``. With ``output_attentions`` / ``output_hidden_states`` and
    ``return_dict_in_generate`` only plain steps and chains are taken.

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> auto = hf_specmm.Auto(testing.text_draft_from_target(testing.tiny_target("llava")), max_tokens=32)
        >>> auto.max_tokens, auto.max_depth
        (32, 8)
    """

    wrapped_name = "draft"

    def __init__(self, draft: torch.nn.Module, max_tokens: int = 64, max_depth: int = 8,
                 costs_file: str | os.PathLike | None = None, prior: Sequence[Sequence[float]] | None = None,
                 shapes: Sequence[int | TreeShape] | None = None):
        super().__init__()
        if isinstance(draft, (Auto, Tree)):
            raise ValueError(f"Auto(draft): draft is already a {type(draft).__name__}; wrap the draft itself once")
        if not isinstance(draft, torch.nn.Module):
            raise TypeError(f"Auto(draft): draft must be a draft model (torch.nn.Module), got {type(draft).__name__}")
        for name, value, high in (("max_tokens", max_tokens, None), ("max_depth", max_depth, MAX_DEPTH)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (high and value > high):
                raise ValueError(f"Auto {name} must be an integer >= 1{f' and <= {high}' if high else ''}, "
                                 f"got {value!r}")
        if prior is not None:
            check_profile(prior, "Auto prior")
        self.draft = draft
        self.max_tokens, self.max_depth = max_tokens, max_depth
        self.costs_file = None if costs_file is None else check_path(costs_file)
        self.prior = [list(map(float, row)) for row in prior] if prior else None
        self.shapes = None if shapes is None else parse_shapes(shapes, max_tokens)

    def acceptance(self, target: Any, sampling: bool = False) -> AcceptanceTable:
        """The acceptance learned for ``target`` with this draft (greedy or ``sampling``), for the process: every
        ``Auto`` around the same draft shares it (the first one's ``prior`` starts it)."""
        tables = _ACCEPTANCE.setdefault(target, weakref.WeakKeyDictionary()).setdefault(self.draft, {})
        if sampling not in tables:
            tables[sampling] = AcceptanceTable(depth=MAX_DEPTH, ranks=8, prior=self.prior)
        return tables[sampling]

    def check(self, trees: bool, plain: bool, vocab_size: int, stateful: str | None) -> None:
        """Before any forward: this Auto's fixed ``shapes`` can run (trees and plain steps available, a tree's
        top_k within the vocabulary). ``stateful``: 'target' or 'draft' where that model has linear-attention
        layers (then neither trees nor plain steps are available)."""
        for s in self.shapes or ():
            why = None
            if s.tree is not None and s.tree.top_k > vocab_size:
                why = f"shape {s.label} has top_k={s.tree.top_k} > the vocabulary's {vocab_size} tokens"
            elif (s.tree is not None and not trees) or (s.gamma == 0 and not plain):
                what = f"shape {s.label} is a tree" if s.tree is not None else "shape 0 is a plain step"
                why = f"{what}, which " + (f"the {stateful}'s linear-attention layers (Gated DeltaNet) cannot roll "
                                           "back" if stateful else "this call cannot take (see docs/auto.md)")
            if why is not None:
                raise UnsupportedGenerationError(f"hf_specmm.Auto(shapes=...): {why}; drop that shape")

    def call_budget(self, budget: DraftBudget, call: CallContext) -> AutoBudget:
        """The call's budget, after refusing (before any forward, naming the option) what has no meaning when each
        round's shape is chosen. Trees and plain steps are taken where the drafter can and no model has
        linear-attention layers (a tree node's state is its parent's; only chain rounds roll such layers back)."""
        bad, config = None, call.config
        if call.gamma_source is not None:
            bad = (f"num_assistant_tokens={budget.gamma} (from {call.gamma_source}): Auto chooses γ each round; drop "
                   "num_assistant_tokens (hf_specmm.Auto(draft, max_depth=...) bounds it)")
        elif budget.schedule != "constant":
            bad = (f"num_assistant_tokens_schedule={budget.schedule!r}: Auto chooses γ each round from measured "
                   "costs; drop the schedule")
        elif budget.confidence is not None:
            bad = "assistant_confidence_threshold: Auto chooses each round's shape; drop the threshold"
        elif config.cache_implementation == "static":
            bad = "cache_implementation='static': Auto's rounds change width; drop it (or use a fixed chain)"
        if bad is not None:
            raise UnsupportedGenerationError(f"generate(assistant_model=hf_specmm.Auto(...)) cannot be used with {bad}.")
        per_node = config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states)
        trees = not per_node and call.stateful is None
        plain = call.stateful is None
        self.check(trees, plain, call.vocab_size, call.stateful)
        return self.budget(call.target, call.batch, bool(config.do_sample), config.cache_implementation or "dynamic",
                           trees, plain, call.device, call.vocab_size)

    def budget(self, target: Any, batch: int, sampling: bool, cache: str, trees: bool, plain: bool,
               device: torch.device, vocab_size: int | None = None) -> AutoBudget:
        """The call's budget: this pair's acceptance, the cost tables of the call's key by batch bucket (a costs
        file read and its entries for this pair checked here, before any forward)."""
        dtype, path = getattr(target, "dtype", None), self.costs_file
        pair = f"{model_name(target)} | {model_name(self.draft)}"
        if path is not None:
            COSTS.check(path, pair)
        grid = [s for s in candidates(self.max_tokens, self.max_depth, plain, trees)
                if s.tree is None or vocab_size is None or s.tree.top_k <= vocab_size]

        def tables(rows: int) -> tuple[str, Any]:
            key = cost_key(pair, device, dtype, rows, cache)
            return key, COSTS.table(key, path)

        save = None if path is None else (lambda keys: COSTS.save(path, keys))
        return AutoBudget(grid, self.acceptance(target, sampling), tables, batch, self.shapes, save)


__all__ = ["Auto", "check_profile"]
