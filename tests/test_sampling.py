"""Speculative sampling is lossless in distribution: per-position token frequencies match plain sampling.

Two-sample χ² test of homogeneity per generated position, N rows per method (one batched call each;
identical rows are independent samples). Bins with fewer than 10 pooled counts are merged. Each
comparison is run at level ALPHA = 1e-3; with the 64 comparisons below the family-wise false-alarm
rate is at most 6.4 % (Bonferroni) for random seeds, and the seeds are fixed, so the test is
deterministic. Power: the same test flags a verifier that accepts every draft (test below).
"""

from __future__ import annotations

import pytest
import torch

import hf_specmm
import hf_specmm.verifier as verify
from hf_specmm import testing

ALPHA = 1e-3
N = 600
NEW = 4
SAMPLING = dict(do_sample=True, temperature=0.9, top_k=40, repetition_penalty=1.2, max_new_tokens=NEW)


def chi2_homogeneity_pvalue(a: torch.Tensor, b: torch.Tensor, vocab: int) -> tuple[float, float, int]:
    """p-value of H0: samples ``a`` and ``b`` come from one categorical distribution."""
    ca = torch.bincount(a, minlength=vocab).double()
    cb = torch.bincount(b, minlength=vocab).double()
    pooled = ca + cb
    big = pooled >= 10
    ca = torch.cat([ca[big], ca[~big].sum()[None]])
    cb = torch.cat([cb[big], cb[~big].sum()[None]])
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    total_a, total_b = ca.sum(), cb.sum()
    pooled_p = (ca + cb) / (total_a + total_b)
    stat = (((ca - total_a * pooled_p) ** 2) / (total_a * pooled_p) + ((cb - total_b * pooled_p) ** 2) / (total_b * pooled_p)).sum()
    dof = max(int(keep.sum()) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0)), float(stat), dof


def noisy_copy(model, scale: float = 0.6):
    """The target's own LM with a perturbed head: agrees sometimes, disagrees often."""
    return testing.perturb_head(testing.text_draft_from_target(model), scale)


def _samples(model, family, draft=None, seed=0, **extra):
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["what color is the circle ?"] * N,
                                 [testing.tiny_image(0)] * N)
    torch.manual_seed(seed)
    kwargs = {} if draft is None else {"assistant_model": draft, "num_assistant_tokens": 3, **extra}
    out = model.generate(**inputs, **SAMPLING, **kwargs)
    return out[:, inputs["input_ids"].shape[1]:]


def assert_sampling_matches_plain(model, family, draft, label):
    """Per-position χ² of sampling with ``draft`` against plain sampling; the acceptance must be partial, so that
    both the accept and the resample paths of the verifier are drawn."""
    plain = _samples(model, family, seed=1)
    hf_specmm.enable(model)
    try:
        spec = _samples(model, family, draft, seed=2)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.9, stats.acceptance_rate
    vocab = model.config.get_text_config().vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        print(f"{family} {label} pos {pos}: chi2={stat:.1f} dof={dof} p={p:.3g} acceptance={stats.acceptance_rate:.2f}")
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


@pytest.fixture(scope="module", params=["llava", "llava_onevision"])
def setup(request):
    family = request.param
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    plain = _samples(model, family, seed=1)
    hf_specmm.enable(model)
    yield family, model, plain
    hf_specmm.disable(model)


def _draft(model, kind):
    if kind == "random":
        return testing.random_text_draft(model)
    if kind == "noisy_copy":
        return noisy_copy(model)
    if kind == "noisy_vlm":  # a VLM draft (the target with a perturbed head) that sees the images
        from test_vlm_draft import noised_copy

        return noised_copy(model, scale=0.6)
    if kind == "noisy_head":  # a feature head: the target's layers perturbed, reading its hidden states
        return testing.feature_head_from_target(model, noise=0.3)
    torch.manual_seed(3)  # image-adapter draft over the noisy copy: reads the target's image embeddings
    return hf_specmm.ImageAdapterDraft.for_target(model, noisy_copy(model))


@pytest.mark.parametrize("kind", ["random", "noisy_copy", "noisy_adapter", "noisy_vlm", "noisy_head"])
def test_speculative_sampling_matches_plain(setup, kind):
    family, model, plain = setup
    draft = _draft(model, kind)
    spec = _samples(model, family, draft, seed=2)
    stats = hf_specmm.last_stats(model)
    assert 0.0 < stats.acceptance_rate < 0.9, f"draft should disagree often, acceptance={stats.acceptance_rate}"
    vocab = model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        print(f"{family} {kind} pos {pos}: chi2={stat:.1f} dof={dof} p={p:.3g} acceptance={stats.acceptance_rate:.2f}")
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


def test_sampling_with_a_confidence_threshold_matches_plain(setup):
    """Rows stop drafting at different steps (per-row draft lengths in one round): still lossless."""
    family, model, plain = setup
    spec = _samples(model, family, noisy_copy(model), seed=4, assistant_confidence_threshold=0.4)
    stats = hf_specmm.last_stats(model)
    assert stats.drafted_tokens < 3 * (stats.target_forwards - N), "the threshold should cut some rounds short"
    vocab = model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


@pytest.mark.parametrize("kind", ["noisy_copy", "noisy_head"])
def test_sampling_with_a_static_cache_matches_plain(setup, kind):
    """Static caches (fixed block width, finished rows kept in place): the same target distribution."""
    family, model, plain = setup
    spec = _samples(model, family, _draft(model, kind), seed=5, cache_implementation="static")
    stats = hf_specmm.last_stats(model)
    assert 0.0 < stats.acceptance_rate < 0.9 and set(stats.gammas) == {3}
    vocab = model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        assert p > ALPHA, f"{kind} position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


def _accept_everything(drafts, q, p, generator=None, lengths=None):
    """A broken verifier: keeps every draft and samples the bonus from p_γ."""
    batch, gamma = drafts.shape
    bonus = torch.multinomial(p[:, gamma], 1)
    return torch.full((batch,), gamma, device=drafts.device), torch.cat([drafts, bonus], 1)


def test_chi2_detects_a_broken_verifier(setup, monkeypatch):
    family, model, plain = setup
    monkeypatch.setattr(verify, "rejection_sample", _accept_everything)
    spec = _samples(model, family, testing.random_text_draft(model), seed=2)
    vocab = model.config.text_config.vocab_size
    pvalues = [chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)[0] for pos in range(1, NEW)]
    assert min(pvalues) < ALPHA, pvalues


@pytest.mark.parametrize("family", [f for f in ("qwen3_vl_moe", "muse_glimmer") if f in testing.FAMILIES])
def test_sampling_matches_plain_on_the_moe_and_soft_capped_targets(family):
    """Qwen3-VL-MoE (top-k routed experts) and Muse Glimmer (soft-capped logits, sliding + NoPE layers): a
    noised text copy, rejected often, still samples the target's distribution at every position."""
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    plain = _samples(model, family, seed=1)
    hf_specmm.enable(model)
    try:
        spec = _samples(model, family, noisy_copy(model), seed=2)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.9, f"draft should disagree often, acceptance={stats.acceptance_rate}"
    vocab = model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        assert p > ALPHA, f"{family} position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"
