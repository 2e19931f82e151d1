"""``hf_specmm.Auto``: each round's shape (a plain target step, a chain of γ or a draft tree) and each call's kind
(plain ``generate`` or speculative) chosen by one rule over estimated rates (docs/auto.md). Modules: ``shapes``
(the grid), ``acceptance`` (by depth and rank; a chain's or tree's expected tokens), ``costs`` (each shape's rate,
the round-time model as prior), ``store`` (the process's tables, costs files), ``budget`` (the rule, per call),
``wrapper`` (``Auto(draft, ...)``). ``simulate`` and ``check_sim_profile`` are set here by :mod:`hf_specmm.simulator`
(``hf-specmm auto-sim``), which drives these classes on a virtual clock; they import nothing of it.
"""

from .acceptance import AcceptanceTable, chain_lengths, check_profile
from .budget import AutoBudget
from .shapes import MAX_DEPTH, Shape
from .store import COSTS
from .wrapper import Auto

__all__ = ["AcceptanceTable", "Auto", "AutoBudget", "COSTS", "MAX_DEPTH", "Shape", "chain_lengths", "check_profile"]

