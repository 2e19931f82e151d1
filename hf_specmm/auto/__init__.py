"""``hf_specmm.Auto`` (issue 27): each round's shape — a plain target step, a chain of γ or a draft tree —
chosen for the highest expected tokens per second from measured costs and learned acceptance.

- :mod:`~hf_specmm.auto.acceptance`: the acceptance table acc[d][r] and expected accepted lengths;
- :mod:`~hf_specmm.auto.costs`: the cost tables (timed on the real rounds) and the curves read from them;
- :mod:`~hf_specmm.auto.store`: the process's cost tables by key, optionally loaded from and saved to a file;
- :mod:`~hf_specmm.auto.policy`: candidate shapes, calibration shapes, the choice;
- :mod:`~hf_specmm.auto.budget`: the per-call budget the loop asks for each round's shape;
- :mod:`~hf_specmm.auto.calls`: whether a whole call runs as plain ``generate`` (its side of the budget);
- :mod:`~hf_specmm.auto.wrapper`: ``Auto(draft, max_tokens=64)``, what a user passes as ``assistant_model``.
"""

from .acceptance import AcceptanceTable, chain_lengths, tree_lengths
from .budget import AutoBudget
from .costs import CostTable
from .policy import CostAwarePolicy, FixedPolicy, Shape
from .store import COSTS
from .wrapper import Auto, check_profile

__all__ = ["AcceptanceTable", "Auto", "AutoBudget", "COSTS", "CostAwarePolicy", "CostTable", "FixedPolicy", "Shape",
           "chain_lengths", "check_profile", "tree_lengths"]
