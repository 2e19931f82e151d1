"""The ``dflash`` draft kind (DFlash block drafters, ``MuseGlimmerAssistantModel``): greedy parity on every kind
of target (LLaVA, M-RoPE Qwen3-VL, sliding-window Gemma 3, Muse Glimmer) at batch 1 and 3, γ 2 and the block's
γ; the drafter's context checked exactly against a from-scratch recomputation every round while planted
drafts are accepted in part (rows at different offsets, holes); stock's DFlash generator's proposals at batch
1; χ² sampling; static caches; refusals before any forward."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import IncompatibleDraftError, testing

pytestmark = pytest.mark.skipif(not hasattr(transformers, "MuseGlimmerAssistantModel"),
                                reason="this transformers has no DFlash drafter class")

from conftest import PROMPTS, batch_inputs, processor, target  # noqa: E402
from test_sampling import assert_sampling_matches_plain  # noqa: E402
from test_train import count_forwards, image_task, mixed_data, target_dir  # noqa: E402,F401 - pytest fixtures

FAMILIES = ("llava", "qwen3_vl", "gemma3", "muse_glimmer")
BLOCK = 4  # proposes up to 3 tokens per round


def dflash(model, **kwargs):
    from hf_specmm.drafts.dflash import dflash_draft_for

    return dflash_draft_for(model, **{"block_size": BLOCK, **kwargs})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_parity(family, batch):
    model = target(family)
    inputs = batch_inputs(family, batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    draft = dflash(model, sliding_window=6 if family == "gemma3" else None)  # the drafter's own windows too
    hf_specmm.enable(model)
    try:
        for gamma in (2, BLOCK + 2):  # past the block: capped at block_size - 1
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"{family} batch={batch} γ={gamma}:\n{out}\n!=\n{plain}"
            stats = hf_specmm.last_stats(model)
            assert stats.drafted_tokens > 0 and max(stats.gammas) == min(gamma, BLOCK - 1)
        for depth in (BLOCK + 1,):  # a block tree from the per-position top-k; depth capped at block_size - 1
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False,
                                 assistant_model=hf_specmm.Tree(draft, top_k=2, depth=depth, nodes=5))
            assert torch.equal(out, plain), f"{family} batch={batch} tree depth {depth}:\n{out}\n!=\n{plain}"
            assert max(hf_specmm.last_stats(model).gammas) == min(depth, BLOCK - 1)
    finally:
        hf_specmm.disable(model)


def _row_inputs(family, i):
    sizes = [(32, 32), None, (64, 32)]
    image = None if sizes[i] is None else testing.tiny_image(i, sizes[i])
    return testing.make_inputs(family, processor(family), [PROMPTS[i]], [image])


def _reference_block_logits(model, draft, row_inputs, generated, anchor):
    """Stock's computation from scratch: the target over the row's whole sequence (prompt + ``generated``), its
    ``hidden_states[i + 1]`` as the context, one drafter forward with no cache at positions 0.."""
    from hf_specmm.drafts.dflash.modeling import embed_block

    ids = torch.cat([row_inputs["input_ids"], generated[None]], 1)
    extra = {k: v for k, v in row_inputs.items() if k != "input_ids"}
    for key, value in extra.items():  # per-token inputs (mask, token types) continue over the new tokens
        if isinstance(value, torch.Tensor) and value.shape == row_inputs["input_ids"].shape:
            fill = 1 if key == "attention_mask" else 0
            extra[key] = torch.cat([value, value.new_full((1, generated.shape[0]), fill)], 1)
    with torch.no_grad():
        out = model(input_ids=ids, **extra, output_hidden_states=True)
        context = torch.cat([out.hidden_states[i + 1] for i in draft.config.target_layer_ids], -1)
        block = torch.full((1, draft.config.block_size), draft.config.mask_token_id)
        block[0, 0] = anchor
        embeds = embed_block(model, block)  # the table without its embed_norm, as stock's generator reads it
        hidden = draft(noise_embeds=embeds, context_hidden_states=context).last_hidden_state
        return model.get_output_embeddings()(hidden[:, 1:]).float()


@pytest.mark.parametrize("family,tree", [(f, False) for f in FAMILIES] + [("qwen3_vl", True), ("muse_glimmer", True),
                                                                         ("llava", "auto"), ("qwen3_vl", "auto")])
def test_context_is_exact_while_planted_drafts_are_accepted_in_part(family, tree, monkeypatch):
    """Every round, each row's block logits equal stock's from-scratch computation over that row's accepted
    sequence (its context: features, positions, holes and row offsets all exact); each row's drafts are then
    overwritten with its next k plain tokens (k random per row and round) and a wrong one, and exactly k are
    accepted: acceptance, rollback and the queued features are exercised as a trained drafter's would be.
    A block tree (top-2 per position): the right token is the second choice past the k planted positions, so
    rounds accept more than k through second branches, and the accepted path's features become the context.
    ``auto``: ``hf_specmm.Auto`` alternating plain steps, chains and trees: the features a plain step verified
    queue after the pending ones (``follow``), and the context stays exact."""
    from hf_specmm.drafts.dflash import DFlashDrafter
    from test_auto import ALTERNATING

    model = testing.tiny_target(family, eos_bias=-30.0)  # no EOS: every row runs to max_new_tokens
    inputs = batch_inputs(family, 3)
    new, gamma = 14, BLOCK - 1
    plain = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    prompt_width, counts = inputs["input_ids"].shape[1], inputs["attention_mask"].sum(-1)
    rows = [_row_inputs(family, i) for i in range(3)]
    draft = dflash(model)
    gen = torch.Generator().manual_seed(0)
    planted: list[list[int]] = []
    checked = []
    real, real_select = DFlashDrafter.block_logits, DFlashDrafter.select_rows
    batch_rows = [0, 1, 2]  # the batch row of each cache row (finished rows leave the caches)

    def selecting(self, keep):
        batch_rows[:] = [batch_rows[k] for k in keep.tolist()]
        real_select(self, keep)

    def planting(self, anchor):
        logits = real(self, anchor)
        ks = []
        for c, i in enumerate(batch_rows):
            done = int(self.anchor_positions[c] - counts[i])  # generated tokens before the anchor
            continuation = plain[i, prompt_width + done:]
            reference = _reference_block_logits(model, draft, rows[i], plain[i, prompt_width:prompt_width + done],
                                                 int(anchor[c]))
            proposable = logits[c].isfinite()  # ids a draft never proposes (placeholders) are -inf
            torch.testing.assert_close(logits[c][proposable], reference[0][proposable], rtol=1e-4, atol=1e-4)
            checked.append(done)
            k = int(torch.randint(0, gamma + 1, (1,), generator=gen))
            for j in range(min(gamma, continuation.shape[0] - 1)):
                right = int(continuation[j + 1])
                wrong = int(torch.where(proposable[j] & (torch.arange(proposable.shape[1]) != right))[0][0])
                logits[c, j] = -1e4
                logits[c, j, right if j < k else wrong] = 0.0
                if tree:  # the runner-up: the right token past the planted ones
                    logits[c, j, wrong if j < k else right] = -1.0
            ks.append(k)
        planted.append(ks)
        return logits

    monkeypatch.setattr(DFlashDrafter, "block_logits", planting)
    monkeypatch.setattr(DFlashDrafter, "select_rows", selecting)
    hf_specmm.enable(model)
    try:
        if tree == "auto":
            shaped = hf_specmm.Auto(draft, shapes=ALTERNATING)
        else:
            shaped = hf_specmm.Tree(draft, top_k=2, depth=gamma, nodes=6) if tree else draft
        out = model.generate(**inputs, max_new_tokens=new, do_sample=False, assistant_model=shaped,
                             **({} if tree else {"num_assistant_tokens": gamma}))
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)
    assert len(set(checked)) > 3  # rounds at several offsets were checked
    if tree == "auto":  # plain rounds between drafted ones, and drafted rounds after them were checked exactly
        shapes = stats.auto["shapes"]
        assert "plain" in shapes[:-1] and any(s != "plain" for s in shapes[shapes.index("plain") + 1:]), shapes
        assert stats.drafted_tokens > 0
        return
    per_row: dict[int, list[tuple[int, int]]] = {}
    for ks, kept in zip(planted, stats.tokens_per_round):
        live = [i for i, got in enumerate(kept) if got > 0]  # the rows in the caches, in order
        assert len(live) == len(ks), (planted, stats.tokens_per_round)
        for i, k in zip(live, ks):
            per_row.setdefault(i, []).append((k, kept[i]))
    if tree:  # at least the planted k, and more through second branches in some rounds
        assert all(got >= k + 1 for rounds in per_row.values() for k, got in rounds[:-1]), per_row
        assert any(got > k + 1 for rounds in per_row.values() for k, got in rounds), per_row
        return
    for i, rounds in per_row.items():  # exactly the planted k accepted; the last round is cut by max_new_tokens
        assert all(got == k + 1 for k, got in rounds[:-1]), (i, rounds)
        assert rounds[-1][1] <= rounds[-1][0] + 1, (i, rounds)
    assert 0 < stats.acceptance_rate < 1


def test_proposals_equal_stock_dflash_generator_at_batch_1():
    """Stock's ``DFlashTokenCandidateGenerator`` (batch 1 only) and this drafter propose the same blocks round by
    round on Muse Glimmer with its own assistant class, and both equal plain greedy."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    from hf_specmm.drafts.dflash import DFlashDrafter

    family = "muse_glimmer"
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = batch_inputs(family, 1)
    draft = dflash(model)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    stock_blocks, ours = [], []
    real_stock, real_ours = DFlashTokenCandidateGenerator.get_candidates, DFlashDrafter.propose

    def stock_candidates(self, input_ids, *args, **kwargs):
        ids, logits = real_stock(self, input_ids, *args, **kwargs)
        if logits is not None:
            stock_blocks.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    def our_proposals(self, budget, select, cur):
        proposal = real_ours(self, budget, select, cur)
        ours.append(proposal.tokens[0].tolist())
        return proposal

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashTokenCandidateGenerator, "get_candidates", stock_candidates)
        stock = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=draft,
                               speculation_type="dflash")
        patch.setattr(DFlashDrafter, "propose", our_proposals)
        hf_specmm.enable(model)
        try:
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=BLOCK - 1)
        finally:
            hf_specmm.disable(model)
    assert torch.equal(stock, plain) and torch.equal(out, plain)
    full = [block for block in ours if len(block) == BLOCK - 1]  # near max_new_tokens we draft fewer
    assert len(full) >= 4 and full == stock_blocks[:len(full)], (ours, stock_blocks)


@pytest.mark.parametrize("tree", (False, True))
def test_sampling_matches_plain(tree):
    """Drafts drawn from q per block position and verified against q (a tree: multi-candidate speculative
    sampling): per-position χ² against plain sampling (600 rows, temperature, top-k and a repetition penalty
    that reads the drafted history)."""
    family = "qwen3_vl"
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    draft = hf_specmm.Tree(dflash(model), top_k=2, depth=3, nodes=5) if tree else dflash(model)
    assert_sampling_matches_plain(model, family, draft, "dflash")


@pytest.mark.parametrize("family", ("llava", "gemma3"))
def test_static_cache_parity(family):
    model = target(family)
    hf_specmm.disable(model)
    inputs = batch_inputs(family, 3)
    static = dict(do_sample=False, cache_implementation="static", max_new_tokens=12)
    plain = model.generate(**inputs, **static)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, **static, assistant_model=dflash(model), num_assistant_tokens=BLOCK - 1)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)
    assert stats.drafted_tokens > 0 and set(stats.gammas) == {BLOCK - 1}


def _refused(model, inputs, draft, match, **kwargs):
    hf_specmm.enable(model)
    try:
        with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match=match):
            model.generate(**inputs, max_new_tokens=4, assistant_model=draft, **kwargs)
    finally:
        hf_specmm.disable(model)
    assert calls["n"] == 0


def test_refusals_before_any_forward():
    model, other = target("llava"), target("qwen3_vl")
    inputs = batch_inputs("llava", 1)
    wide = dflash(model, target_layer_ids=[0, 40])
    _refused(model, inputs, wide, r"reads target layers \[0, 40\]")
    _refused(model, inputs, dflash(model, mask_token_id=10_000), "mask_token_id")
    if model.config.text_config.hidden_size != other.config.text_config.hidden_size:
        _refused(model, inputs, dflash(other), "hidden size")
    # a model no kind claims (no LM head, not a DFlash drafter): refused naming the kinds, dflash among them
    base = transformers.LlamaModel(transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                            num_attention_heads=2, vocab_size=128))
    _refused(model, inputs, base, "dflash")


def test_saved_drafter_loads_through_automodel_and_load_draft(tmp_path):
    """Stock's class as it is: ``save_pretrained`` / ``AutoModel`` and ``hf_specmm.load_draft`` (strict, no remote
    code), checked against the target when given, and drafting identically after the round trip."""
    model = target("muse_glimmer")
    draft = dflash(model, target_layer_ids=[0, 2])  # the last of its three layers
    draft.save_pretrained(tmp_path)
    auto = transformers.AutoModel.from_pretrained(tmp_path)
    loaded = hf_specmm.load_draft(str(tmp_path), target=model)
    for other in (auto, loaded):
        assert type(other) is type(draft)
        assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), other.state_dict().values()))
    with pytest.raises(IncompatibleDraftError, match="reads target layers"):
        hf_specmm.load_draft(str(tmp_path), target=testing.tiny_target("llava"))  # its layers: only 2
    inputs = batch_inputs("muse_glimmer", 3)
    hf_specmm.enable(model)
    try:
        a = model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=draft)
        b = model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=loaded)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(a, b)


def test_training_raises_heldout_tau(target_dir, image_task, monkeypatch):
    """``hf-specmm train --draft-kind dflash``: a fresh one-layer drafter (blocks of 8) trained with the paper's
    loss (random anchors, ``anchors`` per line, decaying position weights) on the tiny target's answers accepts
    clearly more on held-out images than untrained; saved, it loads back as stock's class."""
    from hf_specmm.drafts.dflash import losses
    from hf_specmm.train import train_draft

    from test_train import base_config

    drawn = []

    def spy(mask, count):
        drawn.append(count)
        return sample(mask, count)

    sample = losses.sample_anchors
    monkeypatch.setattr(losses, "sample_anchors", spy)
    root, train, heldout, classes = image_task
    result = train_draft(base_config(target_dir, root, output_dir=str(root / "dflash"), draft_kind="dflash",
                                     data=train, eval_data=heldout, steps=60, lr=3e-3, anchors=6))
    assert len(drawn) == 60 and set(drawn) == {6}
    before, after = result.tau_before, result.tau_after
    print(f"dflash: τ {before['block_efficiency']:.3f} -> {after['block_efficiency']:.3f}, acceptance "
          f"{before['acceptance_rate']:.3f} -> {after['acceptance_rate']:.3f}; losses {result.losses[:3]} ... "
          f"{result.losses[-3:]}")
    assert after["acceptance_rate"] >= before["acceptance_rate"] + 0.2, (before, after)
    assert sum(result.losses[-5:]) < 0.5 * sum(result.losses[:5])
    loaded = hf_specmm.load_draft(result.draft_dir)
    assert type(loaded).__name__ == "MuseGlimmerAssistantModel"


def test_bench_runs_dflash_beside_the_other_kinds():
    """``bench --draft-kind dflash``: the controlled acceptance pattern reaches every block position, so the DFlash
    row runs the same rounds (same τ) as the small LM's, losslessly; its cost model charges one draft forward per
    round (timings are not asserted)."""
    from hf_specmm.bench import BenchConfig, run_benchmark

    result = run_benchmark(BenchConfig(preset="tiny", gammas=[3], batch_sizes=[3], acceptance=0.7, max_new_tokens=30,
                                       repeats=1, warmup=0, draft_kinds=["text_only", "dflash"], stock=False),
                           progress=False)
    text, block = result["rows"]
    assert (text["draft_kind"], block["draft_kind"]) == ("text_only", "dflash")
    assert block["lossless"] is True and 0.0 < block["acceptance"] < 1.0
    assert block["rounds"] == text["rounds"] and block["tau"] == text["tau"]
    costs = block["Tv_ms"] + block["Td_ms"]  # one draft forward per round, whatever γ
    assert block["ideal_speedup"] == pytest.approx(block["tau"] * block["T1_ms"] / costs, rel=1e-6)


def test_speculators_dflash_layout_round_trip_and_refusals(tmp_path):
    """Export to speculators' ``dflash`` layout (its config fields, ids + 1, weight names) and import it back as
    data: the same weights, the same drafts; what the drafter cannot reproduce is refused naming the field."""
    import json

    from safetensors.torch import load_file, save_file

    from hf_specmm.errors import DraftLoadError

    from hf_specmm.drafts.dflash import is_speculators_dflash, load_speculators_dflash, save_speculators_dflash

    model = target("muse_glimmer")
    draft = dflash(model, target_layer_ids=[0, 1])
    folder = save_speculators_dflash(draft, tmp_path / "spec", model, verifier="org/tiny-muse-glimmer")
    config = json.loads((folder / "config.json").read_text())
    assert is_speculators_dflash(config) and config["aux_hidden_state_layer_ids"] == [1, 2]
    assert config["block_size"] == BLOCK and config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    weights = load_file(folder / "model.safetensors")
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight"} <= set(weights)
    loaded = load_speculators_dflash(folder, target=model)
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()))
    inputs = batch_inputs("muse_glimmer", 3)
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=loaded)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)

    def variant(name, change=None, drop=None):
        other = tmp_path / name
        other.mkdir()
        changed = json.loads(json.dumps(config))
        (change or (lambda c: None))(changed)
        (other / "config.json").write_text(json.dumps(changed))
        save_file({k: v for k, v in weights.items() if k != drop}, other / "model.safetensors")
        return other

    with pytest.raises(IncompatibleDraftError, match="sample_from_anchor"):
        load_speculators_dflash(variant("anchor", lambda c: c.update(sample_from_anchor=True)))
    with pytest.raises(IncompatibleDraftError, match="draft_vocab_size"):
        load_speculators_dflash(variant("vocab", lambda c: c.update(draft_vocab_size=64)))
    with pytest.raises(DraftLoadError, match="missing weights.*norm.weight"):
        load_speculators_dflash(variant("missing", drop="norm.weight"))
    with pytest.raises(IncompatibleDraftError, match="LM head"):
        load_speculators_dflash(folder, target=testing.tiny_target("muse_glimmer", seed=1))
    with pytest.raises(IncompatibleDraftError, match="last layer"):
        save_speculators_dflash(dflash(model, target_layer_ids=[0, model.config.text_config.num_hidden_layers - 1]),
                                tmp_path / "last", model)


def test_training_options_are_checked_before_any_forward(target_dir, mixed_data, tmp_path):
    """``--block-size`` / ``--target-layers`` reach the fresh drafter, are for ``dflash`` only, and layers the target
    does not have are refused before any forward."""
    import argparse

    from hf_specmm.train import TrainingInputError, train_draft
    from hf_specmm.train.cli import add_arguments

    from test_train import base_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--target", "t", "--data", "d", "--output-dir", "o", "--draft-kind", "dflash",
                              "--block-size", "5", "--target-layers", "0", "1", "--anchors", "3"])
    assert (args.block_size, args.target_layers, args.anchors) == (5, [0, 1], 3)
    root, data = mixed_data
    with pytest.raises(TrainingInputError, match="block_size: for DFlash drafters only"):
        train_draft(base_config(target_dir, root, data=data, output_dir=str(tmp_path / "a"), block_size=5))
    with pytest.raises(TrainingInputError, match="anchors: for DFlash drafters only"):
        train_draft(base_config(target_dir, root, data=data, output_dir=str(tmp_path / "a"), anchors=4))
    with pytest.raises(TrainingInputError, match=r"anchors=0 \(an integer >= 1\)"):
        train_draft(base_config(target_dir, root, data=data, output_dir=str(tmp_path / "a"), draft_kind="dflash",
                                anchors=0))
    with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match=r"reads target layers \[0, 9\]"):
        train_draft(base_config(target_dir, root, data=data, output_dir=str(tmp_path / "b"), draft_kind="dflash",
                                target_layers=[0, 9]))
    assert calls["n"] == 0
