"""``hf_specmm.Auto``: each round's shape — a plain target step, a chain of γ or a draft tree — and each call's
kind (plain ``generate`` or speculative) chosen by one rule over estimated rates (docs/auto.md).

- :mod:`~hf_specmm.auto.shapes`: shapes and the grid;
- :mod:`~hf_specmm.auto.acceptance`: acceptance by depth and rank, expected tokens of a chain or tree;
- :mod:`~hf_specmm.auto.costs`: each shape's rate from its own rounds, the round-time model as prior;
- :mod:`~hf_specmm.auto.store`: the process's tables and costs files;
- :mod:`~hf_specmm.auto.budget`: the decision rule, the per-call budget;
- :mod:`~hf_specmm.auto.wrapper`: ``Auto(draft, ...)``, what a user passes as ``assistant_model``.

``hf_specmm.auto.simulate`` and ``check_sim_profile`` are :mod:`hf_specmm.simulator`'s (the simulator on a
virtual clock, ``hf-specmm auto-sim``), set here when ``hf_specmm`` is imported: the simulator drives this
package's classes, which import nothing of it.
"""

from .acceptance import AcceptanceTable, chain_lengths, check_profile
from .budget import AutoBudget
from .shapes import MAX_DEPTH, Shape
from .store import COSTS
from .wrapper import Auto

__all__ = ["AcceptanceTable", "Auto", "AutoBudget", "COSTS", "MAX_DEPTH", "Shape", "chain_lengths", "check_profile"]

