"""Benchmarks: ``hf-specmm bench`` and :func:`run_benchmark`.

    >>> from hf_specmm.bench import BenchConfig, run_benchmark, format_table
    >>> result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], max_new_tokens=8, repeats=1), progress=False)
    >>> print(format_table(result))  # doctest: +SKIP
"""

from .controlled import controlled_acceptance, set_reference
from .presets import PRESETS, build_preset, synthetic_inputs
from .report import format_table, write_outputs
from .runner import BenchConfig, run_benchmark

__all__ = ["PRESETS", "BenchConfig", "build_preset", "controlled_acceptance", "format_table", "run_benchmark",
           "set_reference", "synthetic_inputs", "write_outputs"]
