"""The options of one ``hf-specmm bench`` run (:class:`BenchConfig`), checked before any model is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..auto import check_profile
from ..trees import TreeShape
from .presets import DEVICE_MAPS, DRAFT_KINDS, GEMMA4_ASSISTANT
from .presets_gemma4 import ASSISTANT_PRESETS, NO_ASSISTANT


ACCEPTANCE_DRAWS = ("fixed", "per-call")
#: with per-call draws, a method's k-th untimed call draws pattern seed + UNTIMED_DRAWS + k (its k-th timed call:
#: seed + 1 + k, never as high)
UNTIMED_DRAWS = 1 << 20


@dataclass
class BenchConfig:
    preset: str = "cpu-proxy"
    gammas: list[int] = field(default_factory=lambda: [5])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    acceptance: float | None = None  # controlled acceptance α (greedy only); None = the draft's own
    do_sample: bool = False
    max_new_tokens: int = 64
    prompt_tokens: int = 32
    with_image: bool = True
    device: str = "cpu"
    device_map: str | None = None  # "auto": the target spread over the visible devices (accelerate); draft on device
    dtype: str | None = None
    warmup: int = 1
    repeats: int = 3
    stock: bool = True
    seed: int = 0
    draft_kinds: list[str] = field(default_factory=lambda: ["text_only"])  # a row per kind, timed side by side
    mtp_layers: int = 1  # the mtp kind's MTP layers (draft step k runs layer k; Step3.7 checkpoints carry 3)
    compile: bool = False  # also time plain and hf_specmm with a static cache + torch.compile (stock's switch)
    #: [K, D, N] shapes: hf_specmm.Tree(draft, K, D, N) rows per draft kind, timed in turns with each batch's
    #: first γ step (its chain rows and plain); γ of a tree row is its depth D
    trees: list[list[int]] = field(default_factory=list)
    #: rank-aware controlled acceptance: profile[d][r], the target's token is the draft's r-th choice at depth d
    acceptance_profile: list[list[float]] | None = None
    #: also time hf_specmm.Auto(draft, max_tokens=auto_max_tokens) per draft kind, in turns with the first γ step
    auto: bool = False
    auto_max_tokens: int = 64
    #: untimed calls of each Auto row before its timing (a process's first calls)
    auto_calibration_calls: int = 2
    #: passes of the evaluation of each Auto row (0: none): the grid's best row of its draft kind and batch re-timed
    #: in turns beside Auto and plain (see :func:`~hf_specmm.bench.runner.evaluate_auto`)
    auto_eval_repeats: int = 0
    #: untimed calls of each Auto row in its evaluation after its calibration, before the timed passes: the calls a
    #: process has served before the ones timed (Auto learns acceptance across calls). On cpu-proxy at batch 1 its
    #: calls 1-20 ran 1.05-1.07x a fixed chain 5's time, calls 20-60 1.00-1.02x
    auto_warmup_calls: int = 0
    #: controlled acceptance's draws: "fixed", one pattern per (row, position) for every call; "per-call", the
    #: k-th timed call of every method draws pattern k (seed + k + 1), so the rows average over patterns rather
    #: than ranking shapes on how one pattern lines up with their rounds; a method's k-th untimed call (warm-up,
    #: calibration) draws pattern seed + UNTIMED_DRAWS + k, so the calls Auto learns from do not repeat one pattern
    acceptance_draws: str = "fixed"

    def validate(self) -> None:
        """Raise ``ValueError`` naming every bad field (the CLI's ``type=`` checks refuse the same values)."""
        problems = []
        for name in ("gammas", "batch_sizes"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                problems.append(f"{name}={values} (a non-empty list of integers >= 1)")
        for name, low in (("max_new_tokens", 1), ("prompt_tokens", 1), ("repeats", 1), ("warmup", 0), ("seed", 0),
                          ("auto_eval_repeats", 0), ("auto_warmup_calls", 0)):
            if int(getattr(self, name)) < low:
                problems.append(f"{name}={getattr(self, name)} (must be >= {low})")
        if self.acceptance is not None and not 0.0 <= self.acceptance <= 1.0:
            problems.append(f"acceptance={self.acceptance} (in [0, 1])")
        if self.device_map is not None and self.device_map not in DEVICE_MAPS:
            problems.append(f"device_map={self.device_map!r} (None or one of {DEVICE_MAPS})")
        if not self.draft_kinds or any(k not in DRAFT_KINDS for k in self.draft_kinds) \
                or len(set(self.draft_kinds)) != len(self.draft_kinds):
            problems.append(f"draft_kinds={self.draft_kinds} (distinct values among {DRAFT_KINDS})")
        if int(self.mtp_layers) < 1 or (self.mtp_layers != 1 and "mtp" not in self.draft_kinds):
            problems.append(f"mtp_layers={self.mtp_layers} (an integer >= 1, for draft_kinds with 'mtp')")
        if GEMMA4_ASSISTANT in self.draft_kinds and self.preset not in ASSISTANT_PRESETS:
            why = NO_ASSISTANT.get(self.preset, "its target is not a Gemma 4 (an assistant reads a Gemma 4 target's "
                                                "shared K/V and hidden state)")
            problems.append(f"draft_kinds: {GEMMA4_ASSISTANT} on preset {self.preset!r}: {why}; run it on one of "
                            f"{ASSISTANT_PRESETS or '(none: Gemma 4 needs transformers >= 5.24)'}")
        for shape in self.trees:
            try:
                TreeShape(*shape)
            except (TypeError, ValueError) as error:
                problems.append(f"trees: {shape} ({error})")
        if self.acceptance is not None and self.do_sample:
            problems.append("acceptance (controlled acceptance) is defined for greedy decoding; drop do_sample")
        if self.acceptance_profile is not None:
            try:
                check_profile(self.acceptance_profile, "acceptance_profile")
            except ValueError as error:
                problems.append(str(error))
            if self.acceptance is not None:
                problems.append("acceptance and acceptance_profile: give one of them (a profile [[α]] is α at rank 0)")
            if self.do_sample:
                problems.append("acceptance_profile (controlled acceptance) is defined for greedy decoding; drop do_sample")
            if self.compile:
                problems.append("acceptance_profile with compile: the profile reads each round's root from a hook on "
                                "the target's forward, which compiled graphs do not run; drop one of them")
        if self.acceptance_draws not in ACCEPTANCE_DRAWS:
            problems.append(f"acceptance_draws={self.acceptance_draws!r} (one of {ACCEPTANCE_DRAWS})")
        elif self.acceptance_draws != "fixed" and self.acceptance is None and self.acceptance_profile is None:
            problems.append(f"acceptance_draws={self.acceptance_draws!r} is for controlled acceptance: give acceptance "
                            "or acceptance_profile")
        if self.auto_warmup_calls and not (self.auto and self.auto_eval_repeats):
            problems.append(f"auto_warmup_calls={self.auto_warmup_calls} warms Auto up before its evaluation: give auto "
                            "and auto_eval_repeats too")
        if self.auto_max_tokens < 1:
            problems.append(f"auto_max_tokens={self.auto_max_tokens} (must be >= 1)")
        if problems:
            raise ValueError("invalid benchmark config: " + "; ".join(problems))


def config_note(config: BenchConfig, target: Any) -> str | None:
    if config.acceptance is None and config.acceptance_profile is None:
        return None
    note = "controlled acceptance: systems benchmark (random weights)"
    if config.acceptance_draws == "per-call":
        note += "; draws per call (the k-th timed call of every method draws pattern k)"
    if target.dtype in (torch.bfloat16, torch.float16):
        # a random head's near-tied argmaxes flip between a verification and a 1-token step in half precision (H100,
        # benchmarks/results/gpu-h100/llava-1.5-7b-batch1-bf16-before-margin-rule: τ 1.1 at α 0.7); the presets'
        # margin rule (margins.py) rules them out
        note += ("; half precision: the presets' greedy margins are far above rounding (margin rule); a target of "
                 "your own needs them too (hf_specmm.bench.margins.greedy_margins), or lossless False and τ collapse")
    return note
