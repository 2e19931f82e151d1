"""The methods a bench step times in turns: plain ``generate``, stock assisted generation, hf_specmm with one
draft kind (a chain, a ``Tree`` or ``Auto``); each a callable returning the call's sequences."""

from __future__ import annotations

from typing import Any

import torch

from .. import api
from ..auto import Auto
from ..drafts.feature_head.drafter import FeatureHeadDrafter
from ..drafts.registry import kind_of
from ..drafts.wrapper import Tree
from ..targets import target_family
from ..trees import TreeShape
from ..vocab import VocabMap
from .controlled import set_reference
from .presets import SMALL_LM
from .step import StepInputs


def _prompt_positions(draft: Any, vocab: VocabMap, inputs: dict, target: Any) -> torch.Tensor:
    """Where each row's first generated token sits in the draft's own positions (the drafter's prompt length:
    text tokens for a text-only draft, every prompt position for a feature head). A feature head numbers its
    tokens by the target's position rule: where that rule starts new tokens past the valid count (Ovis2.5's
    columns count the left pads), the offset is added."""
    drafter = kind_of(draft).drafter
    lengths = drafter.prompt_lengths(draft, vocab, inputs["input_ids"], inputs["attention_mask"])
    if issubclass(drafter, FeatureHeadDrafter):
        rule = target_family(target).positions.bind(target, inputs["input_ids"], inputs["attention_mask"], inputs)
        if rule.offset is not None:
            lengths = lengths + rule.offset.to(lengths.device)
    return lengths


class PlainMethod:
    """Plain ``generate`` on the step's inputs (``compiled``: stock's static cache + compiled forward)."""

    def __init__(self, step: StepInputs, compiled: bool = False):
        self.step, self.compiled = step, compiled

    def __call__(self) -> torch.Tensor:
        return self.step.target.generate(**self.step.inputs, **self.step.gen_for(self.compiled))


class ControlledMethod:
    """A method whose draft may run under controlled acceptance: the draft's reference (and the call's draws) are set
    before each call, for a timed call by :meth:`prepare` outside its time (:func:`~.timing.interleaved_medians` runs
    it before the clock starts). Timed with the call, that set-up was about 0.5 ms of a 72 ms call on the tiny preset
    that plain's calls did not pay."""

    step: StepInputs
    prepared = False  # prepare() ran for the next call
    turns = 0  # timed calls prepared so far: the k-th draws pattern k (StepInputs.draw_seed)
    untimed = 0  # untimed calls made so far (warm-up, calibration): with per-call draws each draws its own pattern

    def prepare(self) -> None:
        self._set_reference(self.turns)
        self.turns, self.prepared = self.turns + 1, True

    def _before_call(self) -> None:
        """In the call: an untimed one (warm-up, calibration; not prepared) sets its reference itself."""
        if not self.prepared:
            self._set_reference(None)
            self.untimed += 1
        self.prepared = False

    def _set_reference(self, turn: int | None) -> None:
        """The controlled draft's reference for the ``turn``-th timed call (None: the next untimed call,
        :attr:`untimed`)."""
        raise NotImplementedError


class StockMethod(ControlledMethod):
    """Stock assisted generation, counting target forwards. ``stock_as_called`` passes γ to generate() as
    users do (stock ignores it: default γ = 20); ``stock`` sets γ where stock reads it, the draft's
    generation_config, for the run only."""

    def __init__(self, step: StepInputs, name: str):
        self.step, self.name = step, name
        self.forwards: list[int] = []  # target forwards per call

    def _set_reference(self, turn: int | None) -> None:
        step = self.step  # the draft is shared with hf_specmm's methods, which set their own prompt positions
        if step.controlled:  # stock's draft reads the whole prompt, image placeholders included
            set_reference(step.proposers[SMALL_LM], step.reference, step.inputs["attention_mask"].sum(-1),
                          seed=step.draw_seed(turn, self.untimed))

    def __call__(self) -> torch.Tensor:
        step = self.step
        proposer = step.proposers[SMALL_LM]
        self._before_call()
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


class OursMethod(ControlledMethod):
    """hf_specmm with one draft kind (``compiled``: static caches + compiled forwards, stock's switch); keeps each
    call's statistics (``stats``, cleared after a warm-up; with ``auto``, every call's in ``auto_stats`` too)."""

    def __init__(self, step: StepInputs, kind: str, compiled: bool = False, tree: TreeShape | None = None,
                 auto: bool = False):
        self.step, self.kind, self.compiled, self.tree = step, kind, compiled, tree
        self.stats: list[Any] = []
        self.auto_stats: list[Any] = []
        # one Auto per row for the whole step: its acceptance is learned across the calls, as a user's would be
        self.auto = Auto(step.proposers[kind], max_tokens=step.config.auto_max_tokens) if auto else None

    def _set_reference(self, turn: int | None) -> None:
        step, run = self.step, self.step.run
        if step.controlled:
            set_reference(step.proposers[self.kind], step.reference,
                          _prompt_positions(run.drafts[self.kind], run.vocabs[self.kind], step.inputs, step.target),
                          seed=step.draw_seed(turn, self.untimed))

    def __call__(self) -> torch.Tensor:
        step = self.step
        self._before_call()
        api.enable(step.target)
        try:
            proposer, options = step.proposers[self.kind], {"num_assistant_tokens": step.gamma}
            if self.tree is not None:  # the same (controlled) draft, drafting trees: γ is the depth
                proposer = Tree(proposer, self.tree.top_k, self.tree.depth, self.tree.nodes)
                options = {"num_assistant_tokens": self.tree.depth}
            if self.auto is not None:  # Auto chooses γ each round
                proposer, options = self.auto, {}
            out = step.target.generate(**step.inputs, **step.gen_for(self.compiled), assistant_model=proposer,
                                       **options)
            self.stats.append(api.last_stats(step.target))
            if self.auto is not None:
                self.auto_stats.append(self.stats[-1])
            return out
        finally:
            api.disable(step.target)
