"""Side-by-side benchmark: plain ``generate``, stock assisted generation, hf_specmm, in one process.

For each (batch, γ) and each draft kind (the preset's small LM, a random feature head; all timed in
turns on the same inputs): median tokens/s after warm-up, speedups vs plain, τ, acceptance, the
measured step costs (T1 target 1-token step, Tv target verification of γ+1 tokens, Td draft step, Tp
the target's prefill), the cost-model ideal τ·T1/(Tv + γ·Td), efficiency = realised/ideal, the
whole-call ideal (prefill and the rounds the batch ran included), and MBSU = τ/(1 + γ·N_draft/N_target)
(2404.08856). τ here is per verification round (the prefill's token is common to all methods).
Stock is measured twice: "as called" (``generate(assistant_model=d, num_assistant_tokens=γ)``; stock
ignores that argument and uses the draft's generation_config, default γ = 20) and "same γ" (γ set on
the draft's generation_config for the run).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from tqdm.auto import tqdm

from ..auto import chain_lengths
from ..trees import TreeShape
from ..drafts.registry import kind_of
from ..vocab import draft_vocab_size
from .config import BenchConfig
from .methods import OursMethod, PlainMethod, StockMethod
from .presets import GEMMA4_ASSISTANT, SMALL_LM, Preset, build_preset
from .shape_rows import auto_call, auto_row, calibrate_auto, shapes_taken, tree_row
from .step import BenchmarkRun, StepInputs
from .timing import PrefillClock, draft_step_cost, interleaved_medians, target_step_costs


class BenchStep(StepInputs):
    """One (batch, γ) configuration: its inputs, the plain reference continuation, and the methods timed."""

    def __init__(self, run: BenchmarkRun, batch: int, gamma: int, trees: list[TreeShape] | None = None,
                 auto: bool | None = None):
        """``trees`` and ``auto``: the Tree and Auto methods built (default: the config's, in each batch's first γ
        step only)."""
        super().__init__(run, batch, gamma)
        config = run.config
        self.ours = {kind: OursMethod(self, kind) for kind in run.drafts}
        self.ours_compiled = {kind: OursMethod(self, kind, compiled=True) for kind in run.drafts} if config.compile else {}
        first = gamma == config.gammas[0]
        shapes = trees if trees is not None else [TreeShape(*shape) for shape in config.trees] if first else []
        self.ours_tree = {f"{kind}_tree_{'_'.join(map(str, (s.top_k, s.depth, s.nodes)))}": OursMethod(self, kind, tree=s)
                          for kind in run.drafts for s in shapes}
        self.ours_auto = {f"{kind}_auto": OursMethod(self, kind, auto=True)
                          for kind in run.drafts} if (config.auto and first if auto is None else auto) else {}
        self.stock = {name: StockMethod(self, name) for name in ("stock", "stock_as_called")}
        self.stock_error = self._stock_error()

    def _stock_error(self) -> str | None:
        """Why stock assisted generation is not in this step's table (None: it is). Stock runs with the small
        LM draft only, at batch 1, with the same vocabulary; it may refuse even where it should run (5.17
        passes pixel_values to the draft)."""
        run = self.run
        if not (self.config.stock and SMALL_LM in run.drafts and self.batch == 1):
            return None
        if not run.same_vocab:
            # not attempted: stock takes a draft with another vocabulary size for another tokenizer
            # (its universal path needs both tokenizers, which synthetic presets do not have)
            return (f"not run: the draft's vocabulary ({draft_vocab_size(run.preset.draft)} ids) differs from the "
                    f"target's ({run.spec.vocab_size})")
        try:
            self.stock["stock"]()
        except (ValueError, RuntimeError, TypeError, IndexError) as err:
            return f"{type(err).__name__}: {err}"[:300]
        return None

    def _stock_note(self, kind: str) -> str | None:
        """Why stock is not beside a draft kind's row where a user could run it with stock (batch 1)."""
        if kind == GEMMA4_ASSISTANT and self.config.stock and self.batch == 1:
            # stock runs it (generate(assistant_model=assistant) at batch 1), but its candidate generator calls the
            # assistant's forward with the same position_ids and mask for every step of a round: only a count of
            # calls could tell the controlled view a step's depth, and controlled acceptance keys on row state only
            return ("not run: stock's Gemma 4 assistant generator gives each step of a round the same position, so "
                    "controlled acceptance cannot key its steps by generated position")
        return None

    @property
    def stock_runs(self) -> bool:
        return self.config.stock and SMALL_LM in self.run.drafts and self.batch == 1 and self.run.same_vocab \
            and self.stock_error is None

    def methods(self) -> dict[str, Any]:
        methods = {"plain": PlainMethod(self)} | {f"ours_{kind}": m for kind, m in self.ours.items()}
        if self.stock_runs:
            methods |= self.stock
        if self.config.compile:
            methods |= {"plain_compiled": PlainMethod(self, compiled=True)}
            methods |= {f"ours_{kind}_compiled": m for kind, m in self.ours_compiled.items()}
        return methods | {f"ours_{name}": m for name, m in (self.ours_tree | self.ours_auto).items()}

    def measure(self) -> list[dict[str, Any]]:
        """Time every method in turns on the same inputs; a row per draft kind."""
        run, config = self.run, self.config
        calibration_calls = {name: calibrate_auto(self, method) for name, method in self.ours_auto.items()}
        clock = PrefillClock(self.target, run.device)  # each call's decoding phase: the time after its prefill forward
        try:
            timed = interleaved_medians(self.methods(), run.device, config.warmup, config.repeats, clock)
        finally:
            clock.remove()
            for hook in self.hooks:
                hook.remove()
        target_costs = target_step_costs(self.target, self.inputs, self.gamma)
        rows = [self._row(kind, timed, target_costs) for kind in run.drafts]
        rows += [tree_row(self, self.ours_tree[name], name, timed, target_costs["T1"]) for name in self.ours_tree]
        rows += [auto_row(self, self.ours_auto[name], name, timed, calibration_calls[name]) for name in self.ours_auto]
        return rows + [self._compiled_row(kind, timed) for kind in self.ours_compiled]

    def _compiled_row(self, kind: str, timed: dict[str, Any]) -> dict[str, Any]:
        """hf_specmm compiled vs plain compiled (the same switch on both sides) and vs itself eager. The step
        costs of the cost model are eager measurements, so the model's columns are left out of this row."""
        stats = self.ours_compiled[kind].stats
        t_plain, (t_ours, ours) = timed["plain_compiled"][0], timed[f"ours_{kind}_compiled"][:2]
        acceptance = [st.acceptance_rate for st in stats if st.acceptance_rate is not None]
        new_tokens = self.batch * self.config.max_new_tokens
        return {
            "draft_kind": kind, "compiled": True, "batch": self.batch, "gamma": self.gamma,
            "plain_tok_s": new_tokens / t_plain, "ours_tok_s": new_tokens / t_ours, "speedup": t_plain / t_ours,
            "compiled_over_eager": timed[f"ours_{kind}"][0] / t_ours,
            "plain_compiled_over_eager": timed["plain"][0] / t_plain,
            "tau": statistics.mean(st.round_block_efficiency for st in stats),
            "tau_steady": statistics.mean(st.steady_block_efficiency for st in stats),
            "rounds": statistics.mean(len(st.tokens_per_round) for st in stats),
            "acceptance": statistics.mean(acceptance) if acceptance else None,
            "graphs_compiled_timed": sum(st.graphs_compiled for st in stats[-self.config.repeats:]),
            "lossless": bool(torch.equal(ours, timed["plain_compiled"][1])) if not self.config.do_sample else None,
            "times_s": {name: timed[name][2] for name in ("plain_compiled", f"ours_{kind}_compiled")},
        }

    def _row(self, kind: str, timed: dict[str, Any], target_costs: dict[str, float]) -> dict[str, Any]:
        run, config, gamma = self.run, self.config, self.gamma
        new_tokens = self.batch * config.max_new_tokens
        t_plain = timed["plain"][0]
        t_ours, ours = timed[f"ours_{kind}"][:2]
        row: dict[str, Any] = {"draft_kind": kind, "batch": self.batch, "gamma": gamma, "plain_tok_s": new_tokens / t_plain,
                               "stock_error": self.stock_error if kind == SMALL_LM else self._stock_note(kind),
                               "times_s": {name: t[2] for name, t in timed.items()
                                           if name in ("plain", f"ours_{kind}") or kind == SMALL_LM}}
        for name, method in self.stock.items():
            runs = self.stock_runs and kind == SMALL_LM
            row[f"{name}_speedup"] = t_plain / timed[name][0] if runs else None
            # stock's tokens per verification forward (prefill left out), from a forward-call count
            forwards = method.forwards[-config.repeats:]
            row[f"{name}_tau"] = (config.max_new_tokens - 1) / (statistics.mean(forwards) - 1) if runs else None
        # every run replays the same acceptance draws, so runs differ only by machine noise.
        # τ: per row, tokens per verification round after the prefill's token (stock's τ above is the same
        # quantity); τ steady leaves out each row's last round, which max_new_tokens cuts short (what
        # (1 - α^(γ+1)) / (1 - α) predicts)
        stats = self.ours[kind].stats
        row["compiled"] = False
        if self.config.compile:
            row["compiled_over_eager"] = 1.0
        tau = statistics.mean(st.round_block_efficiency for st in stats)
        rounds = statistics.mean(len(st.tokens_per_round) for st in stats)
        costs = target_costs | draft_step_cost(run.drafts[kind], self.target, self.inputs, run.vocabs[kind])
        steps = 1 if kind_of(run.drafts[kind]).block_drafter else gamma  # draft forwards per round
        ideal = tau * costs["T1"] / (costs["Tv"] + steps * costs["Td"])
        acceptance = [st.acceptance_rate for st in stats if st.acceptance_rate is not None]
        row.update({
            "ours_tok_s": new_tokens / t_ours,
            "speedup": t_plain / t_ours,
            "tau": tau,
            "tau_steady": statistics.mean(st.steady_block_efficiency for st in stats),
            "rounds": rounds,
            "acceptance": statistics.mean(acceptance) if acceptance else None,
            "expected_tau": _expected_chain_tau(config, gamma),
            "T1_ms": costs["T1"] * 1e3, "Tv_ms": costs["Tv"] * 1e3, "Td_ms": costs["Td"] * 1e3,
            "Tp_ms": costs["Tp"] * 1e3, "Tpd_ms": costs["Tpd"] * 1e3,
            "Td_over_T1": costs["Td"] / costs["T1"],
            "ideal_speedup": ideal,
            "efficiency": (t_plain / t_ours) / ideal,
            # the whole call: both methods pay the target's prefill Tp (ours also the draft's, Tpd), and a
            # batch runs until its slowest row is done: plain's Tp + (N-1)·T1 vs Tp + Tpd + rounds·(Tv + γ·Td)
            "ideal_speedup_e2e": (costs["Tp"] + (config.max_new_tokens - 1) * costs["T1"]) / (
                costs["Tp"] + costs["Tpd"] + rounds * (costs["Tv"] + steps * costs["Td"])),
            "mbsu": tau / (1 + steps * run.n_drafts[kind] / run.n_target),
            "lossless": bool(torch.equal(ours, self.plain)) if not config.do_sample else None,
        })
        row["efficiency_e2e"] = row["speedup"] / row["ideal_speedup_e2e"]
        # the decoding phase alone (after the target's prefill forward; ours includes the draft's prefill):
        # the quantity the per-row model τ·T1/(Tv + γ·Td) describes, prefill left out on both sides
        row["decode_speedup"] = statistics.median(timed["plain"][3]) / statistics.median(timed[f"ours_{kind}"][3])
        row["efficiency_decode"] = row["decode_speedup"] / ideal
        row["decode_times_s"] = {name: timed[name][3] for name in ("plain", f"ours_{kind}")}
        return row


def _expected_chain_tau(config: BenchConfig, gamma: int) -> float | None:
    """(1 − α^(γ+1)) / (1 − α) under α; 1 + Σ_{d≤γ} Π_{j≤d} p[j][0] under a rank-aware profile."""
    if config.acceptance_profile is not None:
        return 1.0 + chain_lengths(config.acceptance_profile, gamma)[-1]
    if config.acceptance is None:
        return None
    alpha = config.acceptance
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1


def run_benchmark(config: BenchConfig, progress: bool = True, preset: Preset | None = None) -> dict[str, Any]:
    """Run every (batch, γ) configuration of ``config``: plain, stock and hf_specmm with each draft kind,
    timed in turns on the same inputs; returns ``{"env": ..., "rows": [...]}`` (a row per draft kind).
    ``preset``: a prebuilt target and small-LM draft to use instead of building ``config.preset``."""
    config.validate()  # before the preset is built: a bad value must not cost a model build
    if preset is None:
        preset = build_preset(config.preset, config.device, config.dtype, config.seed, config.device_map)
    run = BenchmarkRun(config, preset)
    rows = []
    bar = tqdm([(b, g) for b in config.batch_sizes for g in config.gammas], desc="bench", disable=not progress)
    for batch, gamma in bar:
        rows.extend(BenchStep(run, batch, gamma).measure())
        bar.set_postfix(speedup=f"{rows[-1]['speedup']:.2f}x", tau=f"{rows[-1]['tau']:.2f}")
    if config.auto and config.auto_eval_repeats:
        for batch in config.batch_sizes:
            evaluate_auto(run, batch, rows)
    return {"env": run.env(), "rows": rows}


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over passes of one method's time over another's in the same pass. Paired, not a ratio of
    medians: with per-call draws each pass runs its own pattern (its calls took 2.3-3.1 s on cpu-proxy at batch 1),
    and the two medians could be different patterns' passes (there Auto / best 1.085 of medians, 1.032 paired).

    >>> paired_ratio([2.0, 3.0, 4.4], [2.0, 2.5, 4.0])
    1.1
    """
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def evaluate_auto(run: BenchmarkRun, batch: int, rows: list[dict[str, Any]]) -> None:
    """Selection, then evaluation (as ``benchmarks/auto_world.py`` does on the world): per draft kind with an Auto
    row at ``batch``, its best grid row (the highest speedup; each γ step was timed against its own plain run) is
    re-timed in turns beside Auto and plain, ``auto_eval_repeats`` passes after the warm-up, on a fresh step (the
    same inputs and acceptance draws); Auto first makes ``auto_warmup_calls`` untimed calls after its calibration
    (its acceptance and costs are the process's: so does a process that has served those calls). The best of a
    dozen noisy rows is biased high (on cpu-proxy at batch 4 chain 7 ran 2.31x plain in its step where chains 6
    and 8 ran 1.77x and 2.00x in theirs); the chosen row re-timed is not. Adds to the Auto row: ``best_fixed`` (the
    row's label), ``auto_over_best`` (Auto's wall time over that row's, :func:`paired_ratio` over the evaluation's
    passes), ``eval`` (both speedups vs plain, paired too; the ratio of the median times; every pass's seconds, the
    shapes Auto took, losslessness)."""
    config = run.config
    for auto in [r for r in rows if r.get("tree") == "auto" and r["batch"] == batch]:
        kind = auto["draft_kind"]
        grid = [r for r in rows if r["batch"] == batch and r["draft_kind"] == kind and r.get("tree") != "auto"
                and not r.get("compiled")]
        if not grid:
            continue
        best = max(grid, key=lambda r: r["speedup"])
        tree = None if best.get("tree") is None else TreeShape(*map(int, best["tree"].split(",")))
        step = BenchStep(run, batch, best["gamma"], trees=[tree] if tree else [], auto=True)
        try:
            contender = step.ours_auto[f"{kind}_auto"]
            fixed = step.ours[kind] if tree is None else next(m for m in step.ours_tree.values() if m.kind == kind)
            calibrate_auto(step, contender)
            for _ in range(config.auto_warmup_calls):  # the calls a process has served before these (see the config)
                contender()
            timed = interleaved_medians({"plain": PlainMethod(step), "best": fixed, "auto": contender}, run.device,
                                        config.warmup, config.auto_eval_repeats)
        finally:
            for hook in step.hooks:
                hook.remove()
        passes = {name: timed[name][2] for name in ("plain", "best", "auto")}
        auto["best_fixed"] = best["tree"] if tree is not None else f"chain {best['gamma']}"
        auto["auto_over_best"] = paired_ratio(passes["auto"], passes["best"])
        auto["eval"] = {
            "repeats": config.auto_eval_repeats, "auto_warmup_calls": config.auto_warmup_calls,
            "best_speedup": paired_ratio(passes["plain"], passes["best"]),
            "auto_speedup": paired_ratio(passes["plain"], passes["auto"]),
            # the ratio of the methods' median times (which may be different passes' patterns)
            "auto_over_best_of_medians": timed["auto"][0] / timed["best"][0],
            "times_s": passes,
            "auto_shapes": shapes_taken(contender.stats[-config.auto_eval_repeats:]),
            "auto_calls": [auto_call(st) for st in contender.auto_stats],  # its every call, untimed ones first
            "lossless": None if config.do_sample else all(torch.equal(timed[name][1], step.plain)
                                                          for name in ("best", "auto")),
        }
