"""``hf_specmm.Auto`` (issue 27): each round's shape — a plain target step, a chain of γ or a draft tree —
chosen for the highest expected tokens per second from measured costs and learned acceptance.

- :mod:`~hf_specmm.auto.acceptance`: the acceptance table acc[d][r] and expected accepted lengths;
- :mod:`~hf_specmm.auto.costs`: the cost tables (timed on the real rounds), process-wide, optionally saved;
- :mod:`~hf_specmm.auto.policy`: candidate shapes, calibration shapes, the choice;
- :mod:`~hf_specmm.auto.budget`: the per-call budget the loop asks for each round's shape;
- :mod:`~hf_specmm.auto.wrapper`: ``Auto(draft, max_tokens=64)``, what a user passes as ``assistant_model``.
"""

from .acceptance import AcceptanceTable, chain_lengths, tree_lengths
from .budget import AutoBudget
from .costs import COSTS, CostTable
from .policy import CostAwarePolicy, FixedPolicy, Shape
from .wrapper import Auto, check_profile

__all__ = ["AcceptanceTable", "Auto", "AutoBudget", "COSTS", "CostAwarePolicy", "CostTable", "FixedPolicy", "Shape",
           "chain_lengths", "check_profile", "tree_lengths"]
