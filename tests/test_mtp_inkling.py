"""Inkling's own MTP layers (``model.mtp.*`` in its checkpoint's names) read with ``load_draft(<checkpoint>,
kind="mtp", target=model)``: every stored tensor lands where transformers' ``MtpModel`` puts it; the first round's
proposals equal stock's ``generate(use_mtp=True)`` (batch 1) and an uncached reference forward written here; greedy
output equals plain ``generate`` at batch 1 and 3 (left padding, images, an image-less row), sampling keeps the
target's distribution, ``Auto`` chains run; on static caches its proposals are the dynamic cache's and greedy output
plain ``generate``'s; trees are refused before any work; bad tensors are refused naming the file and the tensor."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.errors import DraftLoadError, SpecMMError

if not _compat.INKLING_SUPPORTED:
    pytest.skip("Inkling needs transformers >= 5.25", allow_module_level=True)

from conftest import batch_inputs  # noqa: E402
from test_bad_inputs import count_forwards  # noqa: E402
from test_mtp import drafted_logits, generate  # noqa: E402
from test_mtp_step3p7 import stock_proposals  # noqa: E402

FAMILY = "inkling"
PROMPT = ["what color is the sky and the tree ?"]


@pytest.fixture(scope="module", params=(False, True), ids=("no_post_norm", "chain_norm"))
def ckpt(request, tmp_path_factory):
    """(folder, target loaded from it, the MTP layer as made, the layer read back): one MTP layer, its output
    unnormed (``chain_hidden_post_norm`` unset) or normed by the shared chain norm."""
    folder = tmp_path_factory.mktemp("inkling") / "ckpt"
    model, made = testing.inkling.mtp_checkpoint(folder, chain_norm=request.param)
    return folder, model, made, hf_specmm.load_draft(str(folder), kind="mtp", target=model)


def reference_logits(model, made, ids):
    """The MTP layer's logits at the last position of ``ids`` [1, L], uncached, from its parameters and the
    target's config alone: fc over [hidden_norm(f_t); embed_norm(E x_{t+1})] (E: the token table, without its own
    norm), the Inkling decoder layer (the target family's class) with a causal mask and no cache, the shared chain
    norm where set, divided by the muP multiplier, through the target's LM head."""
    text = model.config.text_config
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        features = out.hidden_states[-1][:, :-1]  # f_0 .. f_{L-2}, after the final norm
        embeds = torch.nn.functional.embedding(ids[:, 1:], model.get_input_embeddings().weight)
        fused = made.fc(torch.cat([made.pre_fc_norm_hidden(features), made.pre_fc_norm_embedding(embeds)], -1))
        width = fused.shape[1]
        mask = torch.full((width, width), float("-inf")).triu(1)[None, None]
        block = made.body.layers[0]
        hidden = block(fused, attention_mask=mask, conv_mask=None, cache=None)
        if text.chain_hidden_post_norm:
            hidden = made.body.norm(hidden)
        return model.lm_head(hidden[:, -1] / text.logits_mup_width_multiplier)


def test_reads_the_checkpoints_names_into_transformers_layer(ckpt):
    folder, model, made, draft = ckpt
    chain = model.config.text_config.chain_hidden_post_norm
    assert (draft.config.layout, draft.config.post_norm) == ("inkling", "shared" if chain else "none")
    assert draft.config.hidden_first and draft.config.raw_embeddings
    assert draft.config.text_config.layer_types == ["hybrid"] and draft.config.text_config.mlp_layer_types == ["dense"]
    assert type(draft.body.layers[0]) is type(model.model.language_model.layers[0])  # the family's own class
    stored = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.mtp.layers.0.transformer_block.mlp.w13_dn.weight" in stored  # transformers' saved names
    assert ("model.mtp.chain_norm.weight" in stored) == chain
    assert made.state_dict().keys() == draft.state_dict().keys()
    for name, tensor in made.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name


def test_first_round_equals_stocks_use_mtp_and_the_reference(ckpt):
    _, model, made, draft = ckpt
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), PROMPT, [None])
    stock_out, stock = stock_proposals(model, inputs)
    _, ours = drafted_logits(model, inputs, draft, num_assistant_tokens=1)
    proposable = ours[0][0].isfinite()  # ids a draft never proposes (placeholders, ...) are -inf
    assert proposable.sum() > 100
    torch.testing.assert_close(ours[0][0][proposable], stock[0].float()[proposable], rtol=1e-4, atol=1e-4)
    first = stock_out[:, inputs["input_ids"].shape[1]]  # the target's first token: the pair (f_last, first)
    ids = torch.cat([inputs["input_ids"], first[:, None]], 1)
    reference = reference_logits(model, made, ids)[0]
    torch.testing.assert_close(ours[0][0][proposable], reference[proposable], rtol=1e-4, atol=1e-4)
    assert torch.equal(stock_out, _compat.stock_generate(model, **inputs, max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_equals_plain_generate(ckpt, batch):
    """Batch 3: left padding, images, an image-less row; chains past the one layer (its output fed back), so the
    draft's attention and conv states roll back every round."""
    _, model, _, draft = ckpt
    inputs = batch_inputs(FAMILY, batch)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=16, do_sample=False)
    accepted = 0
    for gamma in (1, 3):
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), gamma
        accepted += stats.accepted_tokens
    assert accepted > 0


def test_every_rounds_first_proposal_is_the_references_over_the_kept_tokens(ckpt):
    """Each round's read of its pending slots proposes what the reference does over the prompt and every token
    kept so far (a prefix of the output, longer each round): after each rollback the draft's cache (keys, values
    and the four conv states of its hybrid layer) holds exactly the kept tokens' slots."""
    from hf_specmm.drafts.mtp import MtpDrafter

    _, model, made, draft = ckpt
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), PROMPT, [None])
    seen, real = [], MtpDrafter.read_pending

    def read_pending(self, cur):
        seen.append(real(self, cur))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MtpDrafter, "read_pending", read_pending)
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=3)
    assert 0 < stats.accepted_tokens and len(seen) >= 4
    end = inputs["input_ids"].shape[1]
    for k, logits in enumerate(seen):  # round k read the output's first ``end`` tokens, end growing each round
        proposable = logits[0].isfinite()
        while end < out.shape[1]:
            end += 1
            reference = reference_logits(model, made, out[:, :end])[0]
            if torch.allclose(logits[0][proposable], reference[proposable], rtol=1e-4, atol=1e-4):
                break
        else:
            raise AssertionError(f"round {k}'s proposal is the reference's over no prefix of the output")


def test_sampling_has_the_targets_distribution(ckpt):
    from test_sampling import assert_sampling_matches_plain

    _, model, _, draft = ckpt
    assert_sampling_matches_plain(model, FAMILY, draft, "mtp")


def test_auto_runs_chains(ckpt):
    _, model, _, draft = ckpt
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=16, do_sample=False)
    out, stats = generate(model, inputs, assistant_model=hf_specmm.Auto(draft))
    assert torch.equal(out, plain) and stats.accepted_tokens > 0


def test_trees_are_refused_before_any_work(ckpt):
    _, model, _, draft = ckpt
    inputs = batch_inputs(FAMILY, 1)
    hf_specmm.enable(model)
    try:
        for extra in ({}, {"cache_implementation": "static"}):
            with count_forwards(model, draft) as calls, pytest.raises(SpecMMError, match="stateful layers|static"):
                model.generate(**inputs, max_new_tokens=4, do_sample=False, **extra,
                               assistant_model=hf_specmm.Tree(draft, top_k=2, depth=2, nodes=4))
            assert calls["n"] == 0, extra
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("layers", (1, 2))
def test_static_caches_propose_as_the_dynamic_cache_and_keep_greedy_parity(tmp_path, layers):
    """Batch 3 (left padding, images, an image-less row): every proposal's logits on static caches equal those on
    dynamic caches, round after round of per-row rollbacks (the draft's keys, values and conv states, its holes
    moved left); greedy output equals plain generate's at chains of 1 to 4."""
    model, _ = testing.inkling.mtp_checkpoint(tmp_path / "ckpt", layers=layers)
    draft = hf_specmm.load_draft(str(tmp_path / "ckpt"), kind="mtp", target=model)
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=16, do_sample=False)
    _, dynamic = drafted_logits(model, inputs, draft, num_assistant_tokens=3)
    out, static = drafted_logits(model, inputs, draft, num_assistant_tokens=3, cache_implementation="static")
    assert torch.equal(out, plain)
    # the last round may differ in width (a static cache keeps γ fixed where the dynamic one trims it to the tokens
    # left): every read before it is the same read
    before_last = dynamic[:-4]
    assert len(before_last) >= 20 and len(static) >= len(dynamic)
    for step, (ours, theirs) in enumerate(zip(static, before_last)):
        proposable = theirs.isfinite()
        torch.testing.assert_close(ours[proposable], theirs[proposable], atol=1e-4, rtol=1e-4, msg=f"read {step}")
    for gamma in (1, 2, 4):
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma,
                              cache_implementation="static")
        assert torch.equal(out, plain), gamma
        assert stats.accepted_tokens > 0


@pytest.mark.parametrize("key, shape", (("model.mtp.layers.0.transformer_block.attn.wq_du.weight", (8, 64)),
                                        ("model.mtp.layers.0.transformer_block.mlp.w13_dn.weight", (128, 64)),
                                        ("model.mtp.layers.0.input_proj.weight", (64, 64))))
def test_a_tensor_of_the_wrong_shape_is_refused_naming_file_and_tensor(tmp_path, key, shape):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "ckpt"
    model, _ = testing.inkling.mtp_checkpoint(folder)
    shard = folder / "model-mtp.safetensors"
    tensors = load_file(str(shard))
    tensors[key] = torch.zeros(shape)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(DraftLoadError, match=f"model-mtp.safetensors.*{key.replace('.', '[.]')}"):
        hf_specmm.load_draft(str(folder), kind="mtp", target=model)


def test_two_layers_propose_as_stocks_chain_and_keep_greedy_parity(tmp_path):
    """Two MTP layers: layer 1 reads layer 0's output at the slot before; the first round's two proposals equal
    stock's, and chains of 1, 2 and 4 (the last layer fed its own output) keep plain generate's output."""
    model, _ = testing.inkling.mtp_checkpoint(tmp_path / "ckpt", layers=2)
    draft = hf_specmm.load_draft(str(tmp_path / "ckpt"), kind="mtp", target=model)
    assert draft.config.num_layers == 2 and draft.config.text_config.layer_types == ["hybrid"] * 2
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), PROMPT, [None])
    _, stock = stock_proposals(model, inputs)
    _, ours = drafted_logits(model, inputs, draft, num_assistant_tokens=2)
    for step in range(2):
        proposable = ours[step][0].isfinite()
        torch.testing.assert_close(ours[step][0][proposable], stock[step].float()[proposable], rtol=1e-4, atol=1e-4)
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=16, do_sample=False)
    for gamma in (1, 2, 4):
        out, _ = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), gamma


def test_column_log_scaling_sees_the_columns_stock_gives_the_layer(tmp_path):
    """With ``log_scaling_n_floor`` the layer's full attention scales by the query's absolute cache column: the
    pair (f_t, x_{t+1}) sits at column t + 1 in the draft's cache (after the prompt's first slot, a hole), as in
    stock's ``MtpCache``, so the first round equals stock's at batch 1; a batch is refused before any work."""
    from hf_specmm.errors import UnsupportedGenerationError

    model, _ = testing.inkling.mtp_checkpoint(tmp_path / "ckpt")
    model.config.text_config.log_scaling_n_floor = 2  # every column past 2 is scaled
    draft = hf_specmm.load_draft(str(tmp_path / "ckpt"), kind="mtp", target=model)
    assert draft.body.layers[0].self_attn.config.log_scaling_n_floor == 2
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), PROMPT, [None])
    stock_out, stock = stock_proposals(model, inputs)
    out, ours = drafted_logits(model, inputs, draft, num_assistant_tokens=1)
    proposable = ours[0][0].isfinite()
    torch.testing.assert_close(ours[0][0][proposable], stock[0].float()[proposable], rtol=1e-4, atol=1e-4)
    assert torch.equal(out, _compat.stock_generate(model, **inputs, max_new_tokens=out.shape[1] - inputs[
        "input_ids"].shape[1], do_sample=False))
    hf_specmm.enable(model)
    try:
        with count_forwards(model, draft) as calls, pytest.raises(UnsupportedGenerationError, match="log_scaling"):
            model.generate(**batch_inputs(FAMILY, 3), max_new_tokens=4, do_sample=False, assistant_model=draft)
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


def test_saved_as_an_hf_specmm_draft_and_not_in_speculators_layout(ckpt, tmp_path):
    """Saved and read back, the layer keeps how it runs (output norm, embeddings, logits' scale) and proposes the
    same; speculators' layout, whose MTP layer runs otherwise, is refused."""
    _, model, _, draft = ckpt
    draft.save_pretrained(tmp_path / "saved")
    loaded = hf_specmm.load_draft(str(tmp_path / "saved"), target=model)
    for field in ("post_norm", "raw_embeddings", "logits_divisor", "hidden_first"):
        assert getattr(loaded.config, field) == getattr(draft.config, field), field
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), PROMPT, [None])
    _, mine = drafted_logits(model, inputs, draft, num_assistant_tokens=2)
    _, theirs = drafted_logits(model, inputs, loaded, num_assistant_tokens=2)
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):  # read back, the weights may sit unaligned in the file's mmap: BLAS rounds apart
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="format='hf_specmm'"):
        draft.save_pretrained(tmp_path / "spec", format="speculators")
