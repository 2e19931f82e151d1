"""The bench rows of shaped drafting: ``hf_specmm.Tree`` rows (``--tree``) and ``hf_specmm.Auto`` rows
(``--auto``), each against plain timed in the same turns (see :mod:`.runner`)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import torch

from .timing import target_step_costs

if TYPE_CHECKING:
    from .methods import OursMethod
    from .step import StepInputs


def tree_row(step: StepInputs, method: OursMethod, name: str, timed: dict[str, Any], t1: float) -> dict[str, Any]:
    """hf_specmm with ``hf_specmm.Tree`` around a kind's draft (``method``, timed as ``ours_<name>``), against plain
    timed in the same turns. The chain cost model (τ·T1/(Tv + γ·Td)) does not describe a tree round, so its columns
    are left out; Tv is measured for the tree's width (N + 1 tokens in one target forward) beside T1."""
    stats, shape, new_tokens = method.stats, method.tree, step.batch * step.config.max_new_tokens
    tv = target_step_costs(step.target, step.inputs, shape.nodes)["Tv"]
    t_plain, (t_ours, ours) = timed["plain"][0], timed[f"ours_{name}"][:2]
    acceptance = [st.acceptance_rate for st in stats if st.acceptance_rate is not None]
    return {
        "draft_kind": method.kind, "tree": f"{shape.top_k},{shape.depth},{shape.nodes}", "compiled": False,
        "batch": step.batch, "gamma": shape.depth, "plain_tok_s": new_tokens / t_plain,
        "ours_tok_s": new_tokens / t_ours, "speedup": t_plain / t_ours,
        "tau": statistics.mean(st.round_block_efficiency for st in stats),
        "tau_steady": statistics.mean(st.steady_block_efficiency for st in stats),
        "rounds": statistics.mean(len(st.tokens_per_round) for st in stats),
        "acceptance": statistics.mean(acceptance) if acceptance else None,
        "tree_nodes": statistics.mean(st.tree_nodes_per_round or 0.0 for st in stats),
        "accepted_depth": statistics.mean(st.mean_accepted_depth or 0.0 for st in stats),
        "T1_ms": t1 * 1e3, "Tv_ms": tv * 1e3, "Tv_over_T1": tv / t1,
        "decode_speedup": statistics.median(timed["plain"][3]) / statistics.median(timed[f"ours_{name}"][3]),
        "lossless": bool(torch.equal(ours, step.plain)) if not step.config.do_sample else None,
        "times_s": {key: timed[key][2] for key in ("plain", f"ours_{name}")},
    }


def calibrate_auto(step: StepInputs, method: OursMethod) -> int:
    """``auto_calibration_calls`` untimed calls of an Auto row (a user's process after its first calls);
    returns how many."""
    for _ in range(step.config.auto_calibration_calls):
        method()
    method.stats.clear()
    return step.config.auto_calibration_calls


def auto_row(step: StepInputs, method: OursMethod, name: str, timed: dict[str, Any],
             calibration_calls: int) -> dict[str, Any]:
    """hf_specmm with ``hf_specmm.Auto`` around a kind's draft (``method``, timed as ``ours_<name>``), against plain
    timed in the same turns; the shapes its timed calls took (rounds per shape) and its predicted / measured tokens
    per second."""
    stats, new_tokens = method.stats[-step.config.repeats:], step.batch * step.config.max_new_tokens
    t_plain, (t_ours, ours) = timed["plain"][0], timed[f"ours_{name}"][:2]
    acceptance = [st.acceptance_rate for st in stats if st.acceptance_rate is not None]
    taken = shapes_taken(stats)
    predicted = [st.auto["predicted_tokens_per_s"] for st in stats if st.auto["predicted_tokens_per_s"]]
    measured = [st.auto["measured_tokens_per_s"] for st in stats if st.auto["measured_tokens_per_s"]]
    return {
        "draft_kind": method.kind, "tree": "auto", "compiled": False, "batch": step.batch, "gamma": None,
        "plain_tok_s": new_tokens / t_plain, "ours_tok_s": new_tokens / t_ours, "speedup": t_plain / t_ours,
        "tau": statistics.mean(st.round_block_efficiency for st in stats),
        "tau_steady": statistics.mean(st.steady_block_efficiency for st in stats),
        "rounds": statistics.mean(len(st.tokens_per_round) for st in stats),
        "acceptance": statistics.mean(acceptance) if acceptance else None,
        "tree_nodes": statistics.mean(st.tree_nodes_per_round or 0.0 for st in stats),
        "accepted_depth": statistics.mean(st.mean_accepted_depth or 0.0 for st in stats),
        "auto_shapes": ", ".join(f"{s} ({n})" for s, n in list(taken.items())[:4]),
        "auto_predicted_tok_s": statistics.mean(predicted) if predicted else None,
        "auto_measured_tok_s": statistics.mean(measured) if measured else None,
        "auto_calibration_calls": calibration_calls,
        "auto_calls": [auto_call(st) for st in method.auto_stats],
        "auto_acceptance": stats[-1].auto["acceptance"],
        "decode_speedup": statistics.median(timed["plain"][3]) / statistics.median(timed[f"ours_{name}"][3]),
        "lossless": bool(torch.equal(ours, step.plain)) if not step.config.do_sample else None,
        "times_s": {key: timed[key][2] for key in ("plain", f"ours_{name}")},
    }


def auto_call(stats: Any) -> dict[str, Any]:
    """One Auto call as the bench records it: its seconds, its rounds per shape (``{"plain generate": 1}``: the call
    ran as plain ``generate``) and its whole-call choice (the two rates compared; ``last_stats(model).auto``)."""
    return {"seconds": stats.wall_time_s, "rounds": shapes_taken([stats]), "whole_call": stats.auto["whole_call"]}


def shapes_taken(stats: list[Any]) -> dict[str, int]:
    """Rounds per shape over Auto calls' statistics, most taken first."""
    taken: dict[str, int] = {}
    for st in stats:
        for shape in st.auto["shapes"]:
            taken[shape] = taken.get(shape, 0) + 1
    return dict(sorted(taken.items(), key=lambda x: -x[1]))
