"""Statistics of the last speculative ``generate`` call (see :func:`hf_specmm.last_stats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Counts are summed over the rows of the batch; a forward counts once per row it served.

    ``block_efficiency`` (τ) is generated tokens per target forward, the prefill included (plain
    generate has τ = 1). ``round_block_efficiency`` leaves out the prefill's token and forward, so a
    draft that is always right gives exactly γ + 1; ``expected τ = (1 - α^(γ+1)) / (1 - α)`` for
    independent per-token acceptance α refers to it.
    """

    batch_size: int = 0
    gamma: int = 0  # γ at the start of the call
    target_forwards: int = 0  # row-forwards of the target, prefill included
    draft_forwards: int = 0  # draft forward passes (batched; one per drafted position)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0
    wall_time_s: float = 0.0
    tokens_per_round: list[list[int]] = field(default_factory=list)  # per round, per row (0 once finished)
    gammas: list[int] = field(default_factory=list)  # γ used in each round
    # per round, per row whose drafts counted: drafts (tree nodes) counted as drafted, drafts accepted (the
    # accepted depth); their sums are drafted_tokens and accepted_tokens
    nodes_per_round: list[list[int]] = field(default_factory=list)
    depths_per_round: list[list[int]] = field(default_factory=list)
    graphs_compiled: int = 0  # torch.compile graphs compiled during the call (0 once warm: no recompilation)
    # compiled calls only: frames dynamo gave up compiling in this process so far (its recompile limit): when > 0,
    # some forwards run eager, and a graphs_compiled of 0 does not mean that every round replayed a graph
    recompile_limit_hits: int = 0
    #: ``hf_specmm.Auto``: the shapes taken per round, per shape its rounds, tokens, measured and predicted
    #: tokens per second, the learned acceptance (see docs/auto.md); None for a fixed chain or tree
    auto: dict[str, Any] | None = None

    def record_prefill(self, kept: list[int]) -> None:
        """The prefill forward: one target forward per row, ``kept`` [B] its tokens (1, or 0 if cut)."""
        self.target_forwards += len(kept)
        self.generated_tokens += sum(kept)

    def record_round(self, gamma: int, kept: list[int], accepted: list[int], proposed: list[int],
                     remaining: list[int], unfinished: list[bool], tree: bool = False) -> None:
        """One verification round, per batch row: ``kept`` tokens the row kept (0 once finished),
        ``accepted`` drafts the verifier accepted, ``proposed`` drafts the row proposed (≤ γ; a ``tree``: its
        valid nodes, all verified), and before the round: ``remaining`` tokens it could still add, whether it was
        ``unfinished``.

        A draft counts as drafted only if its row could have kept it: a chain's not past ``max_length``, none
        after an accepted EOS (a row that stopped at its k-th accepted draft had k drafts that counted). A
        tree's ``proposed`` are already its nodes within the row's room (``TreeBlock.drafted``): each counts, as
        in ``tree_nodes_per_round``, unless the row stopped inside the round (then k, as a chain)."""
        if tree:
            drafted = [(p if k > a else min(p, k)) if u else 0
                       for p, u, k, a in zip(proposed, unfinished, kept, accepted)]
        else:
            drafted = [min(g, r - 1, k if k <= a else g) if u else 0
                       for g, r, u, k, a in zip(proposed, remaining, unfinished, kept, accepted)]
        accepted = [min(a, k, d) for a, k, d in zip(accepted, kept, drafted)]
        self.target_forwards += sum(k > 0 for k in kept)
        self.draft_forwards += gamma
        self.drafted_tokens += sum(drafted)
        self.accepted_tokens += sum(accepted)
        self.generated_tokens += sum(kept)
        self.tokens_per_round.append(list(kept))
        live = [i for i, d in enumerate(drafted) if d > 0 and kept[i] > 0]  # rows whose drafts counted
        self.nodes_per_round.append([drafted[i] for i in live])
        self.depths_per_round.append([accepted[i] for i in live])
        self.gammas.append(gamma)

    @property
    def block_efficiency(self) -> float:
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def round_block_efficiency(self) -> float:
        rounds = [n for per_row in self.tokens_per_round for n in per_row if n > 0]
        return sum(rounds) / len(rounds) if rounds else 0.0

    @property
    def steady_block_efficiency(self) -> float:
        """τ per round leaving out each row's last round (the one ``max_new_tokens`` or EOS may cut short):
        the quantity ``(1 - α^(γ+1)) / (1 - α)`` predicts."""
        rounds = []
        for row in zip(*self.tokens_per_round):
            live = [n for n in row if n > 0]
            rounds.extend(live[:-1])
        return sum(rounds) / len(rounds) if rounds else self.round_block_efficiency

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; ``None`` when nothing was drafted (e.g. every row ended at its first
        token): 0 of 0 is no evidence either way, so it is neither 0.0 nor 1.0."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def tree_nodes_per_round(self) -> float | None:
        """Draft nodes counted as drafted per row and round (a chain: γ; a tree: its N valid nodes; fewer near
        ``max_new_tokens``, where nodes past the row's room are not counted); None when nothing was drafted."""
        nodes = [n for per_row in self.nodes_per_round for n in per_row]
        return sum(nodes) / len(nodes) if nodes else None

    @property
    def mean_accepted_depth(self) -> float | None:
        """Accepted drafts per row and round (a tree: the accepted path's depth); None when nothing was drafted."""
        depths = [d for per_row in self.depths_per_round for d in per_row]
        return sum(depths) / len(depths) if depths else None

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        keys = ("batch_size", "gamma", "graphs_compiled", "recompile_limit_hits", "target_forwards", "draft_forwards", "drafted_tokens", "accepted_tokens",
                "generated_tokens", "wall_time_s")
        out: dict[str, float | int | None] = {k: getattr(self, k) for k in keys}
        for k in ("block_efficiency", "round_block_efficiency", "steady_block_efficiency", "acceptance_rate",
                  "tree_nodes_per_round", "mean_accepted_depth", "tokens_per_s"):
            out[k] = getattr(self, k)
        return out
