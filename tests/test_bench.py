"""The benchmark runs every mode on the tiny preset; controlled acceptance reproduces the expected τ.

Timing numbers are not asserted (speed is measured with the CLI, not in unit tests)."""

from __future__ import annotations

import json

import pytest

import torch

import hf_specmm
from hf_specmm import FeatureHeadDraft, cli
from hf_specmm.bench import BenchConfig, build_preset, controlled_acceptance, run_benchmark, set_reference, synthetic_inputs
from hf_specmm.bench import methods, runner, timing
from hf_specmm.bench.config import UNTIMED_DRAWS
from hf_specmm.bench.controlled import hit_table
from hf_specmm.drafts.registry import kind_of
from hf_specmm.targets import target_spec
from hf_specmm.vocab import VocabMap, draft_vocab_size


def test_controlled_acceptance_reproduces_expected_tau():
    """Independent per-token acceptance α gives τ = (1 - α^(γ+1)) / (1 - α) per round."""
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], batch_sizes=[3], acceptance=0.6,
                                       max_new_tokens=120, repeats=1, warmup=0, stock=False), progress=False)
    (row,) = result["rows"]
    assert row["expected_tau"] == pytest.approx((1 - 0.6 ** 4) / 0.4)
    print(f"measured τ {row['tau_steady']:.3f} vs expected {row['expected_tau']:.3f}, acceptance {row['acceptance']:.3f}")
    assert abs(row["tau_steady"] - row["expected_tau"]) < 0.2
    assert row["lossless"] is True


@pytest.mark.parametrize("alpha,gamma", [(1.0, 4), (0.0, 3)])
def test_controlled_acceptance_extremes(alpha, gamma):
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[gamma], batch_sizes=[1], acceptance=alpha,
                                       max_new_tokens=31, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    assert row["tau"] == (gamma + 1 if alpha == 1.0 else 1.0)
    assert row["acceptance"] == alpha
    assert row["lossless"] is True
    # batch 1, same vocabulary: stock assisted generation ran, or says why not (5.17 hands the draft pixel_values)
    assert (row["stock_speedup"] is not None) != (row["stock_error"] is not None)
    if row["stock_error"]:
        assert "pixel_values" in row["stock_error"]
    else:  # stock ran with the same γ (set on the draft's config: stock ignores generate()'s value)
        assert row["stock_tau"] == pytest.approx(row["tau"], rel=1e-9)
    for key in ("T1_ms", "Tv_ms", "Td_ms", "ideal_speedup", "efficiency", "mbsu", "speedup"):
        assert row[key] > 0, key
    assert row["mbsu"] < row["tau"] + 1e-9


def test_acceptance_draws_are_keyed_by_row_and_position():
    """u(seed, row, k) is fixed: hits follow Bernoulli(α) and differ between rows, seeds and positions."""
    table = hit_table(0.3, 0, list(range(40)), 200)
    assert abs(table.float().mean().item() - 0.3) < 0.03
    assert torch.equal(table, hit_table(0.3, 0, list(range(40)), 200))
    assert not torch.equal(table[0], table[1]) and not torch.equal(table, hit_table(0.3, 1, list(range(40)), 200))
    assert torch.equal(hit_table(0.3, 0, [7], 200)[0], table[7])  # row 7 alone sees row 7's draws


def test_every_method_and_draft_kind_sees_the_same_acceptance_pattern():
    """Same α, γ, seed: stock (batch 1), ours with the small LM and ours with a feature head run the same
    number of rounds, so their τ are equal (a speedup ratio then compares costs only)."""
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], batch_sizes=[1], acceptance=0.7,
                                       max_new_tokens=40, repeats=1, warmup=0,
                                       draft_kinds=["text_only", "feature_head"]), progress=False)
    text, head = result["rows"]
    assert (text["draft_kind"], head["draft_kind"]) == ("text_only", "feature_head")
    assert 1.0 < text["tau"] < 4.0 and 0.0 < text["acceptance"] < 1.0  # some rounds rejected, some accepted
    assert head["tau"] == text["tau"] and head["rounds"] == text["rounds"]
    assert head["acceptance"] == text["acceptance"]
    assert text["lossless"] is True and head["lossless"] is True
    assert head["stock_speedup"] is None and head["Td_over_T1"] > 0
    if text["stock_error"] is None:  # transformers 5.17's stock assisted generation refuses LLaVA
        assert text["stock_tau"] == pytest.approx(text["tau"], rel=1e-9)


def test_a_methods_prepare_runs_before_its_clock_starts(monkeypatch):
    """interleaved_medians times the call alone: a method's prepare() (the harness's set-up) runs before the clock
    starts, once per timed call, and is not counted (a fake clock: prepare spends 1 s, the call 0.25 s)."""
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    class Method:
        prepared = calls = 0

        def prepare(self):
            self.prepared += 1
            now[0] += 1.0

        def __call__(self):
            self.calls += 1
            now[0] += 0.25
            return self.calls

    method = Method()
    out = timing.interleaved_medians({"m": method, "plain": lambda: 0}, torch.device("cpu"), warmup=2, repeats=3)
    assert out["m"][0] == 0.25 and out["m"][2] == [0.25] * 3 and out["plain"][2] == [0.0] * 3
    assert (method.prepared, method.calls) == (3, 5)  # the warm-up calls are not prepared by the timer


def test_the_bench_sets_a_controlled_drafts_reference_outside_the_timed_call(monkeypatch):
    """hf_specmm's methods set the controlled draft's reference in prepare() (untimed), once per call: a call
    after its prepare() does not set it again; a call without one (warm-up, calibration) sets it itself."""
    set_calls = []
    real = methods.set_reference
    monkeypatch.setattr(methods, "set_reference", lambda *a, **k: set_calls.append(1) or real(*a, **k))
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], batch_sizes=[1], acceptance=0.7, max_new_tokens=8,
                                       repeats=3, warmup=1, stock=False), progress=False)
    assert result["rows"][0]["lossless"] is True
    assert len(set_calls) == 1 + 3  # the warm-up call, then one per timed call


def test_per_call_draws_give_each_timed_call_its_pattern_and_every_method_the_same(monkeypatch):
    """--acceptance-draws per-call: the k-th timed call of every method draws pattern k (seed + k + 1), its k-th
    untimed call pattern seed + UNTIMED_DRAWS + k; two draft kinds then still run the same rounds (equal τ), and the rows differ from fixed draws'."""
    seeds = {}
    real = methods.set_reference

    def record(draft, *args, seed=None, **kwargs):
        seeds.setdefault(id(draft), []).append(seed)
        return real(draft, *args, seed=seed, **kwargs)

    monkeypatch.setattr(methods, "set_reference", record)
    common = dict(preset="tiny", gammas=[3], batch_sizes=[1], acceptance=0.7, max_new_tokens=24, repeats=3, warmup=1,
                  stock=False, draft_kinds=["text_only", "feature_head"], seed=5)
    text, head = run_benchmark(BenchConfig(**common, acceptance_draws="per-call"), progress=False)["rows"]
    # per draft: the warm-up call (untimed: a pattern of the untimed calls' own), then timed calls 0, 1, 2
    assert sorted(seeds.values()) == [[5 + UNTIMED_DRAWS, 6, 7, 8]] * 2
    assert head["tau"] == text["tau"] and head["rounds"] == text["rounds"] and text["lossless"] and head["lossless"]
    seeds.clear()
    fixed, _ = run_benchmark(BenchConfig(**common), progress=False)["rows"]
    assert sorted(seeds.values()) == [[5, 5, 5, 5]] * 2
    assert fixed["tau"] != text["tau"]  # three patterns, not one


@pytest.mark.parametrize("kind", ["text_only", "feature_head"])
def test_each_row_of_a_batch_sees_the_pattern_it_sees_alone(kind):
    """Ours at batch 4: each row runs exactly the rounds it runs alone (keyed by row, not by call order)."""
    preset = build_preset("tiny")
    target = preset.target
    draft = preset.draft if kind == "text_only" else FeatureHeadDraft.for_target(target)
    view = controlled_acceptance(draft, 0.6, seed=3, wrong_modulus=preset.text_vocab)
    vocab = VocabMap(target_spec(target), draft_vocab_size(draft), torch.device("cpu"))
    inputs = synthetic_inputs(preset, 4, 12, seed=0)
    width = inputs["input_ids"].shape[1]

    def rounds(rows: list[int]) -> list[list[int]]:
        part = {k: v[rows] for k, v in inputs.items()}
        hf_specmm.disable(target)
        plain = target.generate(**part, max_new_tokens=30, do_sample=False)
        hf_specmm.enable(target)
        try:
            lengths = kind_of(draft).drafter.prompt_lengths(draft, vocab, part["input_ids"], part["attention_mask"])
            set_reference(view, plain[:, width:], lengths, rows=rows)
            out = target.generate(**part, max_new_tokens=30, do_sample=False, assistant_model=view,
                                  num_assistant_tokens=3)
            assert torch.equal(out, plain)
            per_round = hf_specmm.last_stats(target).tokens_per_round
        finally:
            hf_specmm.disable(target)
        return [[r[i] for r in per_round if r[i]] for i in range(len(rows))]

    together = rounds([0, 1, 2, 3])
    assert len({tuple(r) for r in together}) > 1  # rows differ: the draws depend on the row
    for i in range(4):
        assert rounds([i]) == [together[i]], i


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "bench"
    code = cli.main(["bench", "--preset", "tiny", "--gammas", "1", "3", "--batch-sizes", "1", "2",
                     "--acceptance", "0.8", "--max-new-tokens", "12", "--repeats", "1", "--warmup", "0",
                     "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "hf_specmm ×" in printed and "MBSU" in printed and "systems benchmark" in printed
    data = json.loads((out / "bench.json").read_text())
    assert [(r["batch"], r["gamma"]) for r in data["rows"]] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(r["stock_speedup"] is None for r in data["rows"] if r["batch"] > 1)  # stock: batch 1 only
    for r in data["rows"]:  # the decoding phase: each call's time after its prefill forward, one per timed call
        for name, decode in r["decode_times_s"].items():
            assert len(decode) == len(r["times_s"][name]) == 1 and 0 < decode[0] < r["times_s"][name][0]
        plain, ours = (r["decode_times_s"][k][0] for k in ("plain", "ours_text_only"))
        assert r["decode_speedup"] == pytest.approx(plain / ours)
        assert r["efficiency_decode"] == pytest.approx(r["decode_speedup"] / r["ideal_speedup"])
    assert "n/a" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sampling_mode_runs_and_bad_flags_are_refused(tmp_path, capsys):
    result = run_benchmark(BenchConfig(preset="tiny", gammas=[2], do_sample=True, max_new_tokens=8, repeats=1,
                                       warmup=0), progress=False)
    assert result["rows"][0]["lossless"] is None  # sampled outputs are compared in distribution by the tests
    with pytest.raises(SystemExit) as exc:  # one line on stderr, exit code 2, before any model is built
        cli.main(["bench", "--preset", "tiny", "--acceptance", "0.5", "--do-sample", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "greedy" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "tiny", "--draft-kind", "medusa", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--draft-kind" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "tiny", "--draft-kind", "feature_head", "feature_head", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0 and "(default: text_only)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exc:  # per-call draws of what? (no controlled acceptance)
        cli.main(["bench", "--preset", "tiny", "--acceptance-draws", "per-call", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--acceptance-draws per-call is for controlled acceptance" in capsys.readouterr().err
    with pytest.raises(ValueError, match="acceptance_draws='per-call' is for controlled acceptance"):
        run_benchmark(BenchConfig(preset="tiny", acceptance_draws="per-call"), progress=False)
    with pytest.raises(ValueError, match=r"acceptance_draws='each' \(one of \('fixed', 'per-call'\)\)"):
        run_benchmark(BenchConfig(preset="tiny", acceptance=0.5, acceptance_draws="each"), progress=False)
    with pytest.raises(ValueError, match="draft_kinds"):
        run_benchmark(BenchConfig(preset="tiny", draft_kinds=["medusa"]), progress=False)
    with pytest.raises(ValueError, match="unknown preset"):
        run_benchmark(BenchConfig(preset="nope"), progress=False)


def test_device_map_auto_dispatches_the_target_and_stays_lossless(tmp_path, capsys):
    """``--device-map auto``: the target goes through accelerate's dispatch (here: every layer on the CPU, the
    only device; on a GPU machine over the GPUs) and the run stays token-identical to plain generate."""
    out = tmp_path / "bench"
    code = cli.main(["bench", "--preset", "tiny", "--device-map", "auto", "--gammas", "3", "--acceptance", "0.8",
                     "--max-new-tokens", "12", "--repeats", "1", "--warmup", "0", "--no-stock", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["env"]["config"]["device_map"] == "auto" and data["env"]["target_device_map"]  # really dispatched
    assert data["rows"][0]["lossless"] is True
    with pytest.raises(SystemExit) as exc:  # argparse: one line, exit code 2, before any model is built
        cli.main(["bench", "--preset", "tiny", "--device-map", "everywhere", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--device-map" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device_map='everywhere'"):
        run_benchmark(BenchConfig(preset="tiny", device_map="everywhere"), progress=False)


def test_reference_ids_outside_the_drafts_vocabulary_are_misses():
    """A random target may pick a reserved/extra id (LLaVA-1.5-7B: 64 rows past a 32000-id draft). No draft can
    propose it, so it is a miss for every method; the override never indexes past the draft's logits
    (which is a device-side assert on CUDA)."""
    from hf_specmm import testing

    target = testing.tiny_target("llava")
    draft = testing.random_text_draft(target)
    vocab = draft.config.vocab_size
    view = controlled_acceptance(draft, 1.0, wrong_modulus=vocab - 8)
    reference = torch.tensor([[5, vocab - 8, 6, vocab - 1], [vocab - 9, 7, vocab - 3, 8]])
    set_reference(view, reference, torch.tensor([10, 10]))
    assert view.hits.tolist() == [[False, False, True, False], [False, True, False, True]]
    tokens = view._controlled_tokens(torch.tensor([10, 11]))  # predicts generated tokens 1 and 2
    assert tokens.tolist() == [(vocab - 8 + 1) % (vocab - 8), vocab - 3 + 1 - (vocab - 8)]
    assert bool((tokens < vocab - 8).all())


def test_generated_ids_the_draft_cannot_read_keep_every_kind_on_the_same_pattern():
    """A target whose greedy picks include ids past a smaller draft's vocabulary (as LLaVA-1.5-7B's 64 extra rows
    beside a 32000-id draft): the text-only drafter reads a stand-in there, so its positions keep counting the
    generated tokens, and the small LM and the feature head run the same rounds at batch 4 (before: the small LM
    fell behind, τ 2.3 vs 2.9 on an H100), losslessly."""
    from hf_specmm import testing
    from hf_specmm.bench.presets import Preset

    target = testing.tiny_target("llava", eos_bias=-30.0)
    with torch.no_grad():  # id 125 (past the draft's 124 ids) takes over where the frequent id 113 would win
        target.lm_head.weight[125] = 1.05 * target.lm_head.weight[113]
    draft = testing.random_text_draft(target, vocab_size=124)
    preset = Preset(target, draft, testing.IMAGE_SIZE, 124, 124)
    inputs = synthetic_inputs(preset, 4, 12)
    plain = target.generate(**inputs, max_new_tokens=40, do_sample=False)
    generated = plain[:, inputs["input_ids"].shape[1]:]
    assert int((generated >= 124).sum()) >= 4, "the fixture must generate ids the draft cannot read"
    result = run_benchmark(BenchConfig(preset="tiny", draft_kinds=["text_only", "feature_head"], gammas=[5],
                                       batch_sizes=[4], acceptance=0.7, max_new_tokens=40, prompt_tokens=12,
                                       repeats=1, warmup=0, stock=False), progress=False, preset=preset)
    small, head = result["rows"]
    assert small["lossless"] is True and head["lossless"] is True
    assert small["rounds"] == head["rounds"] and small["tau"] == pytest.approx(head["tau"])


def test_the_evaluation_warms_auto_up_on_patterns_of_its_own(monkeypatch):
    """auto_warmup_calls: in the evaluation Auto makes that many untimed calls after its calibration, each (per-call
    draws) on a pattern no other of its calls drew, none a timed call's; then every method's k-th timed call draws
    pattern k as before."""
    log: list = []
    real_reference, real_calibrate = methods.set_reference, runner.calibrate_auto

    def record(draft, *args, seed=None, **kwargs):
        log.append(seed)
        return real_reference(draft, *args, seed=seed, **kwargs)

    def calibrate(step, method):
        log.append("calibration")
        calls = real_calibrate(step, method)
        log.append(("calls", calls))
        return calls

    monkeypatch.setattr(methods, "set_reference", record)
    monkeypatch.setattr(runner, "calibrate_auto", calibrate)
    config = BenchConfig(preset="tiny", gammas=[3], batch_sizes=[1], acceptance_profile=[[0.7, 0.2]] * 3,
                         max_new_tokens=24, repeats=2, warmup=1, stock=False, seed=5, auto=True, auto_max_tokens=16,
                         auto_eval_repeats=2, auto_warmup_calls=3, acceptance_draws="per-call")
    auto = next(r for r in run_benchmark(config, progress=False)["rows"] if r.get("tree") == "auto")
    assert auto["eval"]["auto_warmup_calls"] == 3 and auto["eval"]["lossless"] is True
    markers = [i for i, entry in enumerate(log) if entry == "calibration"]
    assert len(markers) == 2  # the grid pass's Auto row, then the evaluation's
    evaluation = log[markers[1] + 1:]  # the evaluation's calls' draws, its calibration's count among them
    (calibration_calls,) = [entry[1] for entry in evaluation if isinstance(entry, tuple)]
    seeds = [entry for entry in evaluation if isinstance(entry, int)]
    base = 5 + UNTIMED_DRAWS
    # Auto: its calibration calls, the 3 warm-up calls and the passes' warm-up call, untimed patterns 0, 1, ...;
    # the best row: its one warm-up call, untimed pattern 0
    assert sorted(s for s in seeds if s >= base) == sorted([base, *range(base, base + calibration_calls + 3 + 1)])
    assert sorted(s for s in seeds if s < base) == [6, 6, 7, 7]  # best and Auto: timed calls 0, 1


def test_auto_warmup_calls_need_an_evaluation(tmp_path, capsys):
    with pytest.raises(ValueError, match="auto_warmup_calls=2 warms Auto up before its evaluation"):
        run_benchmark(BenchConfig(preset="tiny", auto=True, auto_warmup_calls=2), progress=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "tiny", "--auto", "--auto-warmup-calls", "2", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--auto-warmup-calls 2 warms Auto up" in capsys.readouterr().err
