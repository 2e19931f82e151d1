"""What a bench step times its methods on: the run's models (:class:`BenchmarkRun`: the preset's target, each draft
kind's draft and vocabulary map) and one (batch, γ) configuration's inputs, plain reference continuation and
controlled drafts (:class:`StepInputs`). The methods (:mod:`.methods`) and the rows (:mod:`.shape_rows`) read these;
the runner (:mod:`.runner`) builds and times them."""

from __future__ import annotations

import platform
from dataclasses import asdict
from typing import Any

import torch
import transformers

from .. import api
from ..devices import execution_device
from ..drafts.dflash import dflash_draft_for
from ..drafts.registry import kind_of
from ..targets import target_spec
from ..vocab import VocabMap, draft_vocab_size
from .config import UNTIMED_DRAWS, BenchConfig, config_note
from .controlled import controlled_acceptance, watch_target
from .presets import DFLASH_BLOCK, GEMMA4_ASSISTANT, SMALL_LM, Preset, synthetic_inputs
from .presets_gemma4 import assistant_for


def _n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _build_draft(kind: str, preset: Any, seed: int, mtp_layers: int = 1) -> Any:
    """The draft of ``kind``: the preset's small LM (``text_only``), a randomly initialised one-layer
    ``FeatureHeadDraft`` sized for the preset's target (``feature_head``), one-layer DFlash drafter
    (``dflash``, blocks of :data:`DFLASH_BLOCK`), Gemma 4 assistant (``gemma4_assistant``; the config's
    validation allows it on :data:`~.presets_gemma4.ASSISTANT_PRESETS` only) or MTP layers (``mtp``: ``mtp_layers``
    of the target's full-attention decoder layer between the MTP input norms and ``fc``, as checkpoints carry them)."""
    if kind == SMALL_LM:
        return preset.draft
    if kind == GEMMA4_ASSISTANT:
        return assistant_for(preset.target, seed + 1)
    if kind == "dflash":
        return dflash_draft_for(preset.target, seed=seed + 1, block_size=DFLASH_BLOCK)
    from ..drafts.feature_head import FeatureHeadDraft
    from ..drafts.mtp import MtpDraft

    with torch.random.fork_rng(devices=[]):  # the head's init depends on the seed only
        torch.manual_seed(seed + 1)
        if kind == "mtp":
            return MtpDraft.for_target(preset.target, mtp_layers)
        return FeatureHeadDraft.for_target(preset.target)


def _vocab_size(draft: Any, target: Any) -> int:
    """The vocabulary a draft proposes from (a kind scoring with the target's LM head: the target's)."""
    kind = kind_of(draft)
    return draft_vocab_size(draft) if kind.target_vocab_size is None else kind.target_vocab_size(draft, target)


class BenchmarkRun:
    """The models of one benchmark run: the preset's target, each draft kind's draft and vocabulary map."""

    def __init__(self, config: BenchConfig, preset: Preset):
        self.config, self.preset, self.target = config, preset, preset.target
        self.device = execution_device(self.target)  # where its inputs go (a dispatched target's first layer)
        api.disable(self.target)
        self.spec = target_spec(self.target)
        self.drafts = {kind: _build_draft(kind, preset, config.seed, config.mtp_layers) for kind in config.draft_kinds}
        self.vocabs = {kind: VocabMap(self.spec, _vocab_size(d, self.target), self.device) for kind, d in self.drafts.items()}
        # the target ids every compared draft can propose: any other reference id is a miss for all of them alike
        self.proposable = torch.stack([v.proposable.cpu() for v in self.vocabs.values()]).all(0)
        self.same_vocab = draft_vocab_size(preset.draft) == self.spec.vocab_size
        self.n_target = _n_params(self.target)
        self.n_drafts = {kind: _n_params(d) for kind, d in self.drafts.items()}
        # presets have no EOS (random weights): every method generates exactly max_new_tokens per row
        self.gen = dict(max_new_tokens=config.max_new_tokens, do_sample=config.do_sample)

    def env(self) -> dict[str, Any]:
        device, target = self.device, self.target
        return {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            # where the target's layers went under --device-map (module -> device), else None
            "target_device_map": {k: str(v) for k, v in getattr(target, "hf_device_map", {}).items()} or None,
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
            "target_params": self.n_target, "draft_params": self.n_drafts, "config": asdict(self.config),
            "note": config_note(self.config, target),
        }


class StepInputs:
    """One (batch, γ) configuration's inputs, the plain reference continuation and the drafts as its methods call
    them (under controlled acceptance: wrapped, every draft seeing the same (row, position) pattern)."""

    def __init__(self, run: BenchmarkRun, batch: int, gamma: int):
        config, preset = run.config, run.preset
        self.run, self.config, self.target, self.batch, self.gamma = run, config, run.target, batch, gamma
        self.gen = run.gen
        self.inputs = synthetic_inputs(preset, batch, config.prompt_tokens, config.seed, config.with_image)
        prompt_len = self.inputs["input_ids"].shape[1]
        torch.manual_seed(config.seed)
        plain = self.target.generate(**self.inputs, **self.gen)  # the reference continuation for controlled acceptance
        self.plain, self.reference = plain, plain[:, prompt_len:]
        self.proposers = dict(run.drafts)
        self.controlled = config.acceptance is not None or config.acceptance_profile is not None
        self.hooks: list[Any] = []
        if self.controlled:  # every draft sees the same (row, position) acceptance pattern
            self.proposers = {kind: controlled_acceptance(d, config.acceptance or 0.0, seed=config.seed,
                                                          wrong_modulus=preset.text_vocab, proposable=run.proposable,
                                                          profile=config.acceptance_profile)
                              for kind, d in run.drafts.items()}
            if config.acceptance_profile is not None:  # each round's root: the draft forward after a target forward
                self.hooks = [watch_target(d, self.target) for d in self.proposers.values()]

    def draw_seed(self, turn: int | None, untimed: int = 0) -> int:
        """The controlled acceptance's seed for a method's ``turn``-th timed call (None: its ``untimed``-th untimed
        call, warm-up or calibration): the config's seed, or with per-call draws seed + turn + 1 (every method's k-th
        timed call draws the same pattern; see ``BenchConfig.acceptance_draws``) and seed + UNTIMED_DRAWS + untimed
        (Auto's calibration and warm-up calls learn from as many patterns as calls)."""
        if self.config.acceptance_draws == "fixed":
            return self.config.seed
        return self.config.seed + (turn + 1 if turn is not None else UNTIMED_DRAWS + untimed)

    def gen_for(self, compiled: bool) -> dict[str, Any]:
        """generate() options of a method: compiled ones get a static cache of one size for every call (so
        graphs compiled in the warm-up are replayed) and stock's compile config (on CPU it must be told to)."""
        if not compiled:
            return self.gen
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = self.run.device.type != "cuda"  # stock compiles on accelerators only
        length = self.inputs["input_ids"].shape[1] + self.config.max_new_tokens + self.gamma + 1
        return {**self.gen, "cache_implementation": "static", "compile_config": config, "max_cache_len": length}
