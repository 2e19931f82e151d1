"""Greedy margins of random-weight bench targets, and the rule that keeps them above half-precision rounding.

Controlled acceptance replays a plain greedy run's tokens, so it needs every method to produce those same
tokens. In bf16/fp16 a (γ+1)-token verification and a 1-token step (other kernels, other summation orders)
round a target's logits differently; where the top-1 and top-2 logits are closer than that rounding the
argmax can flip. A random LM head over 32K-150K rows puts near-ties at almost every few steps (top-1 minus
top-2 of N Gaussians is often < 1 % of the logit's magnitude, bf16's spacing is 2^-7 of it), so in bf16
the replayed reference breaks within a few tokens (H100: τ 1.1 instead of 2.8).

:func:`apply_margin_rule` rewrites a target's token embedding and LM head (nothing else: every layer still
runs and costs what it did) so that its greedy choice is a fixed successor of the last token, ahead of
every other row by a large fraction of its logit: the embedding dominates the residual stream
(:data:`EMBED_RATIO` times what the layers add, calibrated on a probe), and row ``r`` of the head reads the
embedding of the token(s) whose successor is ``r``. The layers still move every logit (context changes
the logits, not the winner). :func:`greedy_margins` measures the top-1 minus top-2 margins of a greedy
continuation against bf16's spacing at the top logit: the check that the rule holds.

    >>> from hf_specmm.bench import build_preset, synthetic_inputs
    >>> preset = build_preset("tiny", dtype="bfloat16")
    >>> report = greedy_margins(preset.target, synthetic_inputs(preset, 2, 12), max_new_tokens=8)
    >>> report["min_margin_ulps"] >= MIN_MARGIN_ULPS
    True
"""

from __future__ import annotations

from typing import Any

import torch

from .margin_rule import EMBED_RATIO, TOP_LOGIT, apply_margin_rule  # noqa: F401  (the rule, checked here)
from .presets import PRESETS, build_preset, synthetic_inputs

MIN_MARGIN_ULPS = 32  # "well above rounding": top-1 minus top-2 of at least 32 bf16 spacings (1/8 to 1/4 of top-1)
BF16_MANTISSA_BITS = 7  # stored bits: bf16 values in [2^e, 2^(e+1)) are 2^(e-7) apart


def bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The gap between adjacent bf16 numbers at ``|values|``: ``2^(floor(log2|v|) - 7)``."""
    exponent = torch.floor(torch.log2(values.abs().float().clamp_min(torch.finfo(torch.float32).tiny)))
    return torch.exp2(exponent - BF16_MANTISSA_BITS)


@torch.no_grad()
def greedy_margins(model: Any, inputs: dict[str, torch.Tensor], max_new_tokens: int = 32) -> dict[str, Any]:
    """Top-1 minus top-2 logit at every step of ``model``'s plain greedy continuation of ``inputs``, against
    bf16's spacing at the top-1 logit. ``min_margin_ulps`` >= :data:`MIN_MARGIN_ULPS` is "well above
    rounding"; a random head without the rule typically has margins of a few spacings or less."""
    out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, output_logits=True,
                         return_dict_in_generate=True)
    return {"dtype": str(next(model.parameters()).dtype).removeprefix("torch."), **summarize_margins(out.logits)}


def summarize_margins(step_logits: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> dict[str, Any]:
    """Top-1 minus top-2 over every row of every step's logits ([rows, vocab] each), in logits and in bf16
    spacings at the top-1 logit: min, median, and the share of steps under 4 spacings."""
    top = torch.cat([s.float().topk(2, dim=-1).values for s in step_logits]).cpu()  # [steps x rows, 2]
    margin = top[:, 0] - top[:, 1]
    in_ulps = margin / bf16_spacing(top[:, 0])
    return {"steps": int(margin.numel()), "min_margin": margin.min().item(), "median_margin": margin.median().item(),
            "max_top_logit": top[:, 0].abs().max().item(), "min_margin_ulps": in_ulps.min().item(),
            "median_margin_ulps": in_ulps.median().item(), "share_below_4_ulps": (in_ulps < 4).float().mean().item()}


def format_margins(name: str, report: dict[str, Any]) -> str:
    """One line: ``name``'s min / median margins, in logits and in bf16 spacings."""
    return (f"{name}: {report['steps']} greedy steps ({report['dtype']}), top-1 minus top-2 min {report['min_margin']:.3g}"
            f" / median {report['median_margin']:.3g} logits = {report['min_margin_ulps']:.3g} / "
            f"{report['median_margin_ulps']:.3g} bf16 spacings at the top logit (max |top| "
            f"{report['max_top_logit']:.3g}); steps under 4 spacings: {100 * report['share_below_4_ulps']:.1f} %")


def preset_margins(name: str, device: str = "cpu", dtype: str | None = None, batch: int = 1, prompt_tokens: int = 32,
                   max_new_tokens: int = 128, seed: int = 0) -> dict[str, Any]:
    """:func:`greedy_margins` of bench preset ``name`` on the inputs ``hf-specmm bench`` gives it (same seed)."""
    preset = build_preset(name, device, dtype, seed)
    return greedy_margins(preset.target, synthetic_inputs(preset, batch, prompt_tokens, seed), max_new_tokens)


def main(argv: list[str] | None = None) -> int:
    """Prints one line for a preset (``main(["cpu-proxy", "--dtype", "bfloat16"])``, as ``benchmarks/gpu_bench.sh``
    calls it); returns 1 when the margins are not well above bf16 rounding (min < MIN_MARGIN_ULPS spacings)."""
    import argparse

    parser = argparse.ArgumentParser(prog="hf_specmm.bench.margins", description="greedy margins of a bench preset")
    parser.add_argument("preset", choices=PRESETS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    report = preset_margins(args.preset, args.device, args.dtype, args.batch, args.prompt_tokens, args.max_new_tokens)
    print(format_margins(args.preset, report))
    return 0 if report["min_margin_ulps"] >= MIN_MARGIN_ULPS else 1
