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
    rows = tau_table.tau_table(per_task=1, gammas=(2,), trees=(TreeShape(top_k=2, depth=2, nodes=3),))
    chain = [r for r in rows if r["tree"] is None]
    tree = [r for r in rows if r["tree"] == "2,2,3"]
    assert len(chain) == len(tree) > 0 and all(r["gamma"] == 2 for r in tree)
    assert all(r["tau"] >= 1.0 and r["target_forwards"] > 0 for r in tree)


def test_bench_tree_rows_beside_the_chain_rows_under_controlled_acceptance():
    """A top-1 tree of depth γ runs the chain's rounds (same draws, same τ); a wider tree's top path follows
    the same draws; the chain rows are what they are without trees; every row is lossless."""
    from hf_specmm.bench import BenchConfig, run_benchmark
    from hf_specmm.bench.report import format_table

    config = dict(preset="tiny", gammas=[3], batch_sizes=[2], acceptance=0.7, max_new_tokens=24, repeats=1, warmup=0,
                  stock=False, draft_kinds=["text_only", "feature_head"])
    alone = run_benchmark(BenchConfig(**config), progress=False)["rows"]
    result = run_benchmark(BenchConfig(**config, trees=[[1, 3, 3], [3, 3, 6]]), progress=False)
    rows = result["rows"]
    chains = [r for r in rows if r.get("tree") is None]
    assert [(r["tau"], r["rounds"]) for r in chains] == [(r["tau"], r["rounds"]) for r in alone]
    for kind, chain in zip(("text_only", "feature_head"), chains):
        top1, wide = ([r for r in rows if r.get("tree") == shape and r["draft_kind"] == kind] for shape in ("1,3,3", "3,3,6"))
        assert top1[0]["tau"] == chain["tau"] and top1[0]["rounds"] == chain["rounds"]
        # nodes drafted per row and round count only those within the row's room: 6 but near the end
        assert wide[0]["tau"] >= chain["tau"] and 5 < wide[0]["tree_nodes"] <= 6 and wide[0]["gamma"] == 3
        assert wide[0]["Tv_ms"] > 0 and wide[0]["T1_ms"] == chain["T1_ms"]  # Tv measured for the tree's width
    assert all(r["lossless"] is True for r in rows)
    table = format_table(result)
    assert "tree K,D,N" in table.splitlines()[0]
    assert "3,3,6" in table and "chain" in table


def test_bench_bad_tree_is_a_usage_error(capsys, monkeypatch):
    import hf_specmm.bench.runner as runner

    monkeypatch.setattr(runner, "run_benchmark", lambda *a, **k: pytest.fail("ran despite a bad --tree"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--tree", "2,3,99"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "--tree" in err and "99" in err
