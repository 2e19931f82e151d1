"""``hf-specmm world-tau --tree K,D,N``: tree rows beside the chain rows; bad shapes are one-line usage errors."""

from __future__ import annotations

import pytest

from hf_specmm import cli
from hf_specmm.trees import TreeShape
from hf_specmm.world import tau_table


def test_world_table_shows_chain_and_tree_tau_side_by_side():
    rows = [{"task": t, "draft": d, "gamma": g, "tree": None, "tau": 2.0, "acceptance": 0.5}
            for t in ("caption", "vqa") for d in ("a", "b") for g in (3, 5)]
    rows += [{"task": t, "draft": d, "gamma": 8, "tree": "8,8,64", "tau": 4.25, "acceptance": 0.1}
             for t in ("caption", "vqa") for d in ("a", "b")]
    table = tau_table.to_markdown(rows).splitlines()
    assert table[0] == "| task | draft | γ=3 | γ=5 | tree 8,8,64 |" and len(table) == 6
    assert table[2] == "| caption | a | 2.00 (0.50) | 2.00 (0.50) | 4.25 (0.10) |"


@pytest.mark.parametrize("shape", ["2,0,3", "2,2,99", "two", "2,2"])
def test_bad_tree_shapes_are_refused_before_work(shape, capsys, monkeypatch):
    monkeypatch.setattr(tau_table, "tau_table", lambda *a, **k: pytest.fail("measured despite a bad --tree"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["world-tau", "--tree", shape])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "--tree" in err.splitlines()[-1] and "Traceback" not in err


def test_world_tau_measures_tree_rows_on_the_shipped_world():
    rows = tau_table.tau_table(per_task=1, gammas=(2,), trees=(TreeShape(top_k=2, depth=2, tokens=3),))
    chain = [r for r in rows if r["tree"] is None]
    tree = [r for r in rows if r["tree"] == "2,2,3"]
    assert len(chain) == len(tree) > 0 and all(r["gamma"] == 2 for r in tree)
    assert all(r["tau"] >= 1.0 and r["target_forwards"] > 0 for r in tree)
