"""The benchmark's outputs: the markdown table, ``bench.json`` and ``bench.png`` (see :mod:`.runner`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = [("draft_kind", "draft", "{}"), ("tree", "tree K,D,N", "{}"), ("compiled", "compiled", "{}"), ("batch", "batch", "{}"), ("gamma", "γ", "{}"), ("plain_tok_s", "plain tok/s", "{:.1f}"),
           ("stock_as_called_speedup", "stock as called ×", "{:.2f}"), ("stock_as_called_tau", "its τ", "{:.2f}"),
           ("stock_speedup", "stock same-γ ×", "{:.2f}"), ("stock_tau", "its τ", "{:.2f}"), ("speedup", "hf_specmm ×", "{:.2f}"), ("compiled_over_eager", "compiled/eager ×", "{:.2f}"), ("tau", "τ", "{:.2f}"),
           ("tau_steady", "τ steady", "{:.2f}"), ("expected_tau", "τ exp", "{:.2f}"), ("rounds", "rounds", "{:.0f}"), ("acceptance", "acc", "{:.2f}"), ("T1_ms", "T1 ms", "{:.1f}"),
           ("Tv_ms", "Tv ms", "{:.1f}"), ("Td_ms", "Td ms", "{:.2f}"), ("Td_over_T1", "Td/T1", "{:.3f}"), ("Tv_over_T1", "Tv/T1", "{:.2f}"),
           ("ideal_speedup", "ideal ×", "{:.2f}"), ("efficiency", "eff", "{:.2f}"),
           ("Tp_ms", "Tp ms", "{:.0f}"), ("ideal_speedup_e2e", "ideal e2e ×", "{:.2f}"),
           ("efficiency_e2e", "eff e2e", "{:.2f}"), ("decode_speedup", "decode ×", "{:.2f}"),
           ("efficiency_decode", "eff decode", "{:.2f}"), ("mbsu", "MBSU", "{:.2f}"), ("tree_nodes", "nodes", "{:.1f}"),
           ("accepted_depth", "acc depth", "{:.2f}"), ("auto_shapes", "Auto's shapes (rounds)", "{}"),
           ("best_fixed", "best row", "{}"), ("auto_over_best", "Auto/best re-timed", "{:.2f}"),
           ("lossless", "lossless", "{}")]
#: columns shown only when some row has them (``--compile``, ``--tree``, ``--auto``, ``--auto-eval-repeats``); a chain
#: row's tree cell reads "chain", an Auto row's "auto"
OPTIONAL_COLUMNS = ("compiled_over_eager", "tree", "tree_nodes", "accepted_depth", "Tv_over_T1", "auto_shapes",
                    "best_fixed", "auto_over_best")


def format_table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    columns = [c for c in COLUMNS if c[0] not in OPTIONAL_COLUMNS or any(r.get(c[0]) is not None for r in rows)]
    head = [title for _, title, _ in columns]
    body = [[("chain" if k == "tree" else "n/a") if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in columns]
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in body]
    return "\n".join(lines)


def write_outputs(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """``bench.json``, ``bench.md`` and ``bench.png`` (speedup and τ vs γ per batch size)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2))
    (out_dir / "bench.md").write_text(format_table(result) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    # compiled and tree rows are in the table and the JSON; the plot follows the chains over γ
    eager = [r for r in result["rows"] if not r.get("compiled") and r.get("tree") is None]
    for batch, kind in sorted({(r["batch"], r["draft_kind"]) for r in eager}):
        rows = [r for r in eager if r["batch"] == batch and r["draft_kind"] == kind]
        gammas = [r["gamma"] for r in rows]
        ax1.plot(gammas, [r["speedup"] for r in rows], "o-", label=f"hf_specmm {kind}, batch {batch}")
        if any(r["stock_speedup"] is not None for r in rows):
            ax1.plot(gammas, [r["stock_speedup"] or float("nan") for r in rows], "s--", label=f"stock, batch {batch}")
        ax2.plot(gammas, [r["tau_steady"] for r in rows], "o-", label=f"τ steady {kind}, batch {batch}")
        if rows[0]["expected_tau"] is not None:
            ax2.plot(gammas, [r["expected_tau"] for r in rows], "k:", label="(1-α^(γ+1))/(1-α)")
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set(xlabel="γ", ylabel="speedup vs plain generate")
    ax2.set(xlabel="γ", ylabel="τ (tokens per round)")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['env']['config']['preset']} on {result['env']['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "bench.png", dpi=110)
    plt.close(fig)
    return [out_dir / "bench.json", out_dir / "bench.md", out_dir / "bench.png"]
