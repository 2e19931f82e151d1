"""The methods a bench step times in turns: plain ``generate``, stock assisted generation, hf_specmm with one
draft kind (a chain, a ``Tree`` or ``Auto``); each a callable returning the call's sequences."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import api
from ..auto import Auto
from ..drafts.registry import kind_of
from ..drafts.wrapper import Tree
from ..trees import TreeShape
from ..vocab import VocabMap
from .controlled import set_reference
from .presets import SMALL_LM

if TYPE_CHECKING:
    from .runner import BenchStep


def _prompt_positions(draft: Any, vocab: VocabMap, inputs: dict) -> torch.Tensor:
    """Where each row's first generated token sits in the draft's own positions (the drafter's prompt length:
    text tokens for a text-only draft, every prompt position for a feature head)."""
    return kind_of(draft).drafter.prompt_lengths(draft, vocab, inputs["input_ids"], inputs["attention_mask"])


class PlainMethod:
    """Plain ``generate`` on the step's inputs (``compiled``: stock's static cache + compiled forward)."""

    def __init__(self, step: "BenchStep", compiled: bool = False):
        self.step, self.compiled = step, compiled

    def __call__(self) -> torch.Tensor:
        return self.step.target.generate(**self.step.inputs, **self.step.gen_for(self.compiled))


class StockMethod:
    """Stock assisted generation, counting target forwards. ``stock_as_called`` passes γ to generate() as
    users do (stock ignores it: default γ = 20); ``stock`` sets γ where stock reads it, the draft's
    generation_config, for the run only."""

    def __init__(self, step: "BenchStep", name: str):
        self.step, self.name = step, name
        self.forwards: list[int] = []  # target forwards per call

    def __call__(self) -> torch.Tensor:
        step = self.step
        proposer = step.proposers[SMALL_LM]
        if step.controlled:  # stock's draft reads the whole prompt, image placeholders included
            set_reference(proposer, step.reference, step.inputs["attention_mask"].sum(-1))
        calls: list[int] = []
        handle = step.target.register_forward_pre_hook(lambda *args: calls.append(1))
        draft_config = proposer.generation_config
        saved = (draft_config.num_assistant_tokens, draft_config.num_assistant_tokens_schedule)
        if self.name == "stock":
            draft_config.num_assistant_tokens, draft_config.num_assistant_tokens_schedule = step.gamma, "constant"
        try:
            extra = {"num_assistant_tokens": step.gamma} if self.name == "stock_as_called" else {}
            return step.target.generate(**step.inputs, **step.gen, assistant_model=proposer, **extra)
        finally:
            draft_config.num_assistant_tokens, draft_config.num_assistant_tokens_schedule = saved
            handle.remove()
            self.forwards.append(len(calls))


class OursMethod:
    """hf_specmm with one draft kind (``compiled``: static caches + compiled forwards, stock's switch); keeps each
    call's statistics."""

    def __init__(self, step: "BenchStep", kind: str, compiled: bool = False, tree: TreeShape | None = None,
                 auto: bool = False):
        self.step, self.kind, self.compiled, self.tree = step, kind, compiled, tree
        self.stats: list[Any] = []
        # one Auto per row for the whole step: its acceptance is learned across the calls, as a user's would be
        self.auto = Auto(step.proposers[kind], max_tokens=step.config.auto_max_tokens) if auto else None

    def __call__(self) -> torch.Tensor:
        step, run = self.step, self.step.run
        api.enable(step.target)
        try:
            if step.controlled:
                set_reference(step.proposers[self.kind], step.reference,
                              _prompt_positions(run.drafts[self.kind], run.vocabs[self.kind], step.inputs))
            proposer, options = step.proposers[self.kind], {"num_assistant_tokens": step.gamma}
            if self.tree is not None:  # the same (controlled) draft, drafting trees: γ is the depth
                proposer = Tree(proposer, self.tree.top_k, self.tree.depth, self.tree.nodes)
                options = {"num_assistant_tokens": self.tree.depth}
            if self.auto is not None:  # Auto chooses γ each round
                proposer, options = self.auto, {}
            out = step.target.generate(**step.inputs, **step.gen_for(self.compiled), assistant_model=proposer,
                                       **options)
            self.stats.append(api.last_stats(step.target))
            return out
        finally:
            api.disable(step.target)
