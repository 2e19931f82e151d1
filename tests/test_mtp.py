"""The ``mtp`` draft kind: a target checkpoint's own multi-token-prediction layer, read with
``load_draft(<target checkpoint>, kind="mtp", target=model)``. Only the MTP tensors are read (their shard alone),
bound to the target's embedding and LM head; greedy parity at batch 1 and 3 (left padding, a row without an image)
in vLLM's and transformers' layouts, trees, static caches, ``Auto``, sampling (χ²); one step equals transformers'
own ``MtpModel``; on Qwen3.5 the first round's proposals equal an independent reference of vLLM's MTP forward and
the hybrid target's rollback holds; every bad checkpoint is refused naming the file and the tensor."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.drafts.mtp import MtpDraft, MtpDrafter
from hf_specmm.errors import DraftLoadError, IncompatibleDraftError
from conftest import batch_inputs, target
from test_sampling import assert_sampling_matches_plain
from test_train import base_config, image_task, target_dir  # noqa: F401 - pytest fixtures

FAMILY = "llava"
NEW = 16


@pytest.fixture(scope="module")
def model():
    return target(FAMILY)


def checkpoint(tmp_path, model, layout="vllm", noise=0.1, **kwargs):
    draft = testing.mtp_from_target(model, noise=noise)
    return testing.write_mtp_checkpoint(model, draft, tmp_path / layout, layout=layout, **kwargs), draft


def generate(model, inputs, **kwargs):
    hf_specmm.enable(model)
    try:
        return model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **kwargs), hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)


# ---- reading the target's checkpoint ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", ("vllm", "transformers"))
def test_reads_only_the_mtp_tensors_and_binds_the_targets_modules(tmp_path, model, layout, monkeypatch):
    import safetensors

    folder, made = checkpoint(tmp_path, model, layout)
    opened, read, sliced, real_open = [], [], [], safetensors.safe_open

    class Recording:
        def __init__(self, path, *args, **kwargs):
            opened.append(str(path).rsplit("/", 1)[-1])
            self.inner = real_open(path, *args, **kwargs)

        def __enter__(self):
            self.file = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.file.keys()

        def get_slice(self, key):
            sliced.append(key)
            return self.file.get_slice(key)

        def get_tensor(self, key):
            read.append(key)
            return self.file.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    draft = hf_specmm.load_draft(str(folder), kind="mtp", target=model)
    monkeypatch.undo()
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    # the MTP shard, and one row of the token embedding (the target is the checkpoint's model): nothing else is read
    table = next(k for k in index if k.endswith("embed_tokens.weight") and "vision" not in k)
    assert sorted(set(opened)) == sorted({"model-mtp.safetensors", index[table]})
    assert sorted(read) == sorted(k for k, f in index.items() if f == "model-mtp.safetensors")
    assert set(sliced) - set(read) == {table}
    assert isinstance(draft, MtpDraft) and hf_specmm.kind_of(draft).name == "mtp"
    for name, tensor in made.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
    # the target's embedding and LM head are referenced (the same modules, no copies), never parameters of the draft
    assert draft._target["embed"] is model.get_input_embeddings()
    assert draft._target["lm_head"] is model.get_output_embeddings()
    assert not any(p.data_ptr() == model.get_output_embeddings().weight.data_ptr() for p in draft.parameters())
    assert sum(p.numel() for p in draft.parameters()) == sum(p.numel() for p in made.parameters())
    assert draft.config.layout == layout


@pytest.mark.parametrize("layout", ("vllm", "transformers"))
@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_parity(tmp_path, model, layout, batch):
    folder, _ = checkpoint(tmp_path, model, layout)
    draft = hf_specmm.load_draft(str(folder), kind="mtp", target=model)
    inputs = batch_inputs(FAMILY, batch)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    accepted = []
    for gamma in (1, 3, 5):
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), (layout, batch, gamma)
        accepted.append(stats.acceptance_rate)
    assert 0.05 < min(accepted) and max(accepted) < 0.95, accepted  # partial: rollbacks at different offsets


@pytest.mark.parametrize("layers", (1, 2))
def test_trees_static_caches_and_auto_keep_parity(model, layers):
    draft = testing.mtp_from_target(model, noise=0.1, layers=layers)
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    tree, stats = generate(model, inputs, assistant_model=hf_specmm.Tree(draft, top_k=2, depth=3, nodes=6))
    assert torch.equal(tree, plain) and stats.accepted_tokens > 0
    static, _ = generate(model, inputs, assistant_model=draft, num_assistant_tokens=3, cache_implementation="static")
    assert torch.equal(static, plain)
    auto, _ = generate(model, inputs, assistant_model=hf_specmm.Auto(draft, max_tokens=6, max_depth=3))
    assert torch.equal(auto, plain)


def test_sampling_has_the_targets_distribution():
    model = testing.tiny_target(FAMILY, seed=0, eos_bias=-30.0)
    assert_sampling_matches_plain(model, FAMILY, testing.mtp_from_target(model, noise=0.3), "mtp")


# ---- the step against transformers' MtpModel ------------------------------------------------------------

def test_a_step_equals_transformers_mtp_model(model):
    """transformers' ``MtpModel`` (one ``MtpLayer`` on the target's decoder-layer class) with this draft's weights
    predicts, from the target's last hidden states over a prompt, the logits the draft predicts."""
    from transformers.modeling_layers import MtpModel

    draft = testing.mtp_from_target(model, noise=0.3)
    text = model.config.get_text_config()
    text.num_mtp_layers = 1
    try:
        stock = MtpModel(model, 1).eval()
    finally:
        del text.num_mtp_layers
    names = {"fc.weight": "eh_proj.weight", "pre_fc_norm_embedding.weight": "enorm.weight",
             "pre_fc_norm_hidden.weight": "hnorm.weight", "body.norm.weight": "post_norm.weight"}
    state = {"layers.0." + (names.get(k) or "mtp_block." + k.removeprefix("body.layers.0.")): v
             for k, v in draft.state_dict().items()}
    missing, unexpected = stock.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("embed_tokens", "shared_head")) for k in missing)
    ids = torch.randint(3, 90, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.model.language_model(input_ids=ids).last_hidden_state  # post-norm: what the LM head reads
        nxt = model.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)
        shifted = torch.cat([ids[:, 1:], nxt], 1)  # MtpModel: token t + 1 with the hidden state at t
        positions = torch.arange(1, 13)[None]
        tokens, logits, _ = stock(input_ids=shifted, last_hidden_states=hidden, position_ids=positions,
                                  attention_mask=torch.ones_like(shifted), mtp_cache=None)
        # the draft: slot t reads (emb(x_t), f_{t-1}); its first slot (x_0 alone) is a hole
        full = torch.cat([ids, nxt], 1)
        features = torch.nn.functional.pad(hidden, (0, 0, 1, 0))
        valid = torch.ones_like(full, dtype=torch.bool)
        valid[:, 0] = False
        out = draft(features=features, input_ids=full, attention_mask=valid.long(), position_ids=torch.arange(13)[None],
                    logits_to_keep=1)
    torch.testing.assert_close(out.logits[:, -1].float(), logits[:, -1].float(), rtol=1e-4, atol=1e-4)
    assert int(out.logits[0, -1].argmax()) == int(tokens[0, 0])


# ---- Qwen3.5: vLLM's layout, its reference forward, the hybrid rollback -------------------------------------

def vllm_reference(target, weights: dict[str, torch.Tensor], ids: torch.Tensor, gamma: int) -> list[torch.Tensor]:
    """vLLM's MTP drafting (``qwen3_5_mtp.py``) written out for batch 1: slot i reads (the target's normed last
    hidden state at i, the token at i + 1) at position i; each step appends (its own normed output, its token) at
    the next position; every step recomputed over the whole sequence (no cache), causal attention."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q

    text = target.config.get_text_config()
    layer = q.Qwen3_5DecoderLayer(text, layer_idx=text.layer_types.index("full_attention"))
    layer.load_state_dict({k.removeprefix("mtp.layers.0."): v for k, v in weights.items()
                           if k.startswith("mtp.layers.0.")})
    norms = {}
    for name in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        norms[name] = q.Qwen3_5RMSNorm(text.hidden_size, eps=text.rms_norm_eps)
        norms[name].load_state_dict({"weight": weights[f"mtp.{name}.weight"]})
    rotary = q.Qwen3_5TextRotaryEmbedding(text)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        hidden = target.model.language_model(input_ids=ids).last_hidden_state[0]
        tokens = ids[0, 1:].tolist() + [int(target.lm_head(hidden[-1]).argmax())]
        proposals = []
        for _ in range(gamma):
            x = torch.cat([norms["pre_fc_norm_embedding"](embed(torch.tensor(tokens))),
                           norms["pre_fc_norm_hidden"](hidden)], -1) @ weights["mtp.fc.weight"].T
            positions = torch.arange(len(tokens)).view(1, 1, -1).expand(3, 1, -1)
            out = layer(x[None], position_embeddings=rotary(x[None], positions), attention_mask=None,
                        position_ids=positions)
            out = out[0] if isinstance(out, tuple) else out
            g = norms["norm"](out[0])
            proposals.append(lm_head(g[-1]))
            tokens.append(int(proposals[-1].argmax()))
            hidden = torch.cat([hidden, g[-1:]])
    return proposals


def drafted_logits(model, inputs, draft, **kwargs):
    """The logits behind every proposed token (each read of a pending block or a drafted token), in order."""
    seen, real_pending, real_draft = [], MtpDrafter.read_pending, MtpDrafter.read_draft

    def read_pending(self, cur):
        seen.append(real_pending(self, cur))
        return seen[-1]

    def read_draft(self, token):
        seen.append(real_draft(self, token))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MtpDrafter, "read_pending", read_pending)
        patch.setattr(MtpDrafter, "read_draft", read_draft)
        out, _ = generate(model, inputs, assistant_model=draft, **kwargs)
    return out, seen


@pytest.fixture(scope="module")
def qwen_mtp(tmp_path_factory):
    """The tiny Qwen3.5 target, a checkpoint of it with an MTP layer in vLLM's layout, and that layer read back."""
    if not testing.HYBRID_FAMILIES:
        pytest.skip("this transformers has no Qwen3.5")
    qwen = testing.tiny_target("qwen3_5", eos_bias=-30.0)
    folder = testing.write_mtp_checkpoint(qwen, testing.mtp_from_target(qwen, noise=0.3),
                                          tmp_path_factory.mktemp("qwen") / "q")
    return qwen, folder, hf_specmm.load_draft(str(folder), kind="mtp", target=qwen)


def test_qwen3_5_proposals_equal_vllms_forward(qwen_mtp):
    from safetensors.torch import load_file

    family = "qwen3_5"
    qwen, folder, draft = qwen_mtp
    weights = load_file(str(folder / "model-mtp.safetensors"))
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["what color is the sky and the tree ?"],
                                 [None])
    _, seen = drafted_logits(qwen, inputs, draft, num_assistant_tokens=4)
    reference = vllm_reference(qwen, weights, inputs["input_ids"], 4)
    for step, expected in enumerate(reference):  # the first round: the prompt, then 3 of its own drafts read
        proposable = seen[step][0].isfinite()  # ids a draft never proposes (placeholders, ...) are -inf
        assert proposable.sum() > 100
        torch.testing.assert_close(seen[step][0][proposable], expected.float()[proposable], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", (1, 2))
def test_qwen3_5_hybrid_rollback_keeps_parity(qwen_mtp, tmp_path, layers):
    """Batch 3 with images, left padding and a row without an image: the target's linear-attention states roll back
    as for every draft kind (with one MTP layer and with two, vLLM's layout)."""
    family = "qwen3_5"
    qwen, _, draft = qwen_mtp
    if layers > 1:
        made = testing.mtp_from_target(qwen, noise=0.1, layers=layers, shared=True)
        folder = testing.write_mtp_checkpoint(qwen, made, tmp_path / "q", count=layers)
        draft = hf_specmm.load_draft(str(folder), kind="mtp", target=qwen)
        assert draft.config.text_config.layer_types == ["full_attention"] * layers
    inputs = testing.make_inputs(family, testing.tiny_processor(family),
                                 ["describe the image", "what color is the sky and the tree ?", "hi"],
                                 [testing.tiny_image(0), None, testing.tiny_image(2)])
    plain = _compat.stock_generate(qwen, **inputs, max_new_tokens=NEW, do_sample=False)
    out, stats = generate(qwen, inputs, assistant_model=draft, num_assistant_tokens=3)
    assert torch.equal(out, plain) and stats.accepted_tokens > 0


# ---- saving, and what is refused -----------------------------------------------------------------------------

def test_save_and_load_round_trip_with_a_card(tmp_path, model):
    draft = testing.mtp_from_target(model, noise=0.1)
    draft.save_pretrained(tmp_path / "saved")
    card = (tmp_path / "saved" / "README.md").read_text()
    assert "MTP layer" in card and "mtp" in card
    loaded = hf_specmm.load_draft(str(tmp_path / "saved"), target=model)
    assert isinstance(loaded, MtpDraft)
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def _edit_config(folder, **fields):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.get("text_config", config).update(fields)
    path.write_text(json.dumps(config))


def _drop_from_index(folder, key):
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    del index["weight_map"][key]
    path.write_text(json.dumps(index))


def test_bad_checkpoints_are_refused_naming_the_file_and_tensor(tmp_path, model):
    from safetensors.torch import load_file, save_file

    def fresh(name, **kwargs):
        return testing.write_mtp_checkpoint(model, testing.mtp_from_target(model), tmp_path / name, **kwargs)

    def refused(folder, *needles, error=DraftLoadError, target=model):
        with pytest.raises(error) as info:
            hf_specmm.load_draft(str(folder), kind="mtp", target=target)
        for needle in needles:
            assert needle in str(info.value), (needle, str(info.value))

    folder = fresh("shape")  # a tensor of another width
    tensors = load_file(str(folder / "model-mtp.safetensors"))
    tensors["mtp.fc.weight"] = tensors["mtp.fc.weight"][:, :-2].contiguous()
    save_file(tensors, str(folder / "model-mtp.safetensors"))
    refused(folder, "model-mtp.safetensors", "mtp.fc.weight", "[64, 126]")

    refused(fresh("count", count=2), "mtp_num_hidden_layers=2", "layers [0]")  # count the tensors contradict

    folder = fresh("shard")  # the index names a shard that is absent
    (folder / "model-mtp.safetensors").unlink()
    refused(folder, "model-mtp.safetensors", "mtp.", "absent")

    folder = fresh("missing")  # a tensor of the layer missing
    _drop_from_index(folder, "mtp.pre_fc_norm_hidden.weight")
    refused(folder, "pre_fc_norm_hidden.weight")

    refused(fresh("undeclared", count=None), "mtp_num_hidden_layers", "declares no MTP layer count")

    folder = tmp_path / "plain"  # a target checkpoint without MTP tensors
    model.save_pretrained(folder)
    refused(folder, "no MTP tensors", "model.safetensors")

    refused(fresh("no-target"), "target=", target=None)
    with pytest.raises(ValueError, match="checkpoint of its own"):
        hf_specmm.load_draft(str(folder), kind="feature_head", target=model)
    other = testing.tiny_target(FAMILY, seed=1)  # another target's weights: the fingerprint differs
    refused(fresh("other"), "embed_tokens.weight", "differs", error=IncompatibleDraftError, target=other)


# ---- training --------------------------------------------------------------------------------------------------

def test_training_raises_heldout_tau_and_fine_tunes_a_checkpoints_layer(target_dir, image_task, tmp_path):  # noqa: F811
    """``draft_kind="mtp"``: a fresh MTP layer trained with the feature heads' distillation raises the held-out
    acceptance; given the target's own checkpoint as ``draft``, its MTP layer is read and fine-tuned; both are
    saved as hf_specmm MTP drafts with their cards."""
    from hf_specmm.train import train_draft

    root, train, heldout, classes = image_task
    result = train_draft(base_config(target_dir, root, output_dir=str(root / "mtp"), draft_kind="mtp",
                                     data=train, eval_data=heldout, steps=60, stage2_steps=60, lr=3e-3,
                                     token_loss_weight=1.0))
    before, after = result.tau_before, result.tau_after
    print(f"mtp: τ {before['block_efficiency']:.3f} -> {after['block_efficiency']:.3f}, acceptance "
          f"{before['acceptance_rate']:.3f} -> {after['acceptance_rate']:.3f}")
    assert isinstance(result.draft, MtpDraft) and result.global_step == 120
    assert after["acceptance_rate"] >= before["acceptance_rate"] + 0.3, (before, after)
    loaded = hf_specmm.load_draft(result.draft_dir)
    assert isinstance(loaded, MtpDraft) and hf_specmm.draft_metadata(loaded)["draft_kind"] == "mtp"

    # the target checkpoint with an MTP layer: its layer read, then fine-tuned
    target_model = testing.tiny_target("llava", eos_bias=-30.0)
    carried = testing.mtp_from_target(target_model, noise=0.1)
    folder = testing.write_mtp_checkpoint(target_model, carried, tmp_path / "with-mtp")
    testing.tiny_processor("llava").save_pretrained(folder)
    tuned = train_draft(base_config(folder, root, output_dir=str(root / "mtp-tuned"), draft_kind="mtp",
                                    draft=str(folder), draft_config=None, data=train, eval_data=heldout, steps=2,
                                    stage2_steps=1, lr=1e-4))
    assert isinstance(tuned.draft, MtpDraft) and tuned.draft.config.source == str(folder)
    assert not torch.equal(tuned.draft.fc.weight.cpu(), carried.fc.weight)  # it moved from the checkpoint's weights
    assert (tuned.draft.fc.weight.cpu() - carried.fc.weight).abs().max() < 0.05


# ---- speculators' mtp layout -------------------------------------------------------------------------------------

def test_speculators_layout_round_trip_and_refusals(tmp_path, model):
    """``save_pretrained(format="speculators")`` writes speculators' ``mtp`` layout; ``load_draft(path, target=...)``
    reads it back (the same tensors); a checkpoint of another width or with a stray tensor is refused."""
    from safetensors.torch import load_file, save_file

    draft = testing.mtp_from_target(model, noise=0.1)
    draft.save_pretrained(tmp_path / "spec", format="speculators")
    raw = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert raw["speculators_model_type"] == "mtp" and raw["num_nextn_predict_layers"] == 1
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert {"mtp_layers.0.input_proj.weight", "mtp_layers.0.token_layernorm.weight",
            "mtp_layers.0.hidden_layernorm.weight", "mtp_layers.0.final_layernorm.weight"} <= set(tensors)
    assert not any("embed" in k or "lm_head" in k for k in tensors)
    back = hf_specmm.load_draft(str(tmp_path / "spec"), target=model)
    assert isinstance(back, MtpDraft) and back.config.layout == "speculators"
    for name, tensor in draft.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    out, _ = generate(model, inputs, assistant_model=back, num_assistant_tokens=3)
    assert torch.equal(out, plain)
    with pytest.raises(DraftLoadError, match="target=model"):
        hf_specmm.load_draft(str(tmp_path / "spec"))
    tensors["mtp_layers.0.stray.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "spec" / "model.safetensors"))
    with pytest.raises(DraftLoadError, match="mtp_layers.0.stray.weight"):
        hf_specmm.load_draft(str(tmp_path / "spec"), target=model)
    raw["transformer_layer_config"]["hidden_size"] = 32
    (tmp_path / "spec" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(IncompatibleDraftError, match="hidden_size"):
        hf_specmm.load_draft(str(tmp_path / "spec"), target=model)


def test_a_hub_id_reads_only_the_mtp_shard_from_the_cache(tmp_path, model):
    """``load_draft("org/name", kind="mtp", target=...)``: config.json, the index and the MTP shard come from the Hub
    cache (offline), and the same layer is read as from the folder."""
    from fake_hub import populate_hf_cache, run_python

    folder, made = checkpoint(tmp_path, model)
    cache = tmp_path / "hub"
    populate_hf_cache(cache, "org/tiny-with-mtp", folder)
    torch.save(made.state_dict(), tmp_path / "expected.pt")
    code = f"""
import torch, hf_specmm
from hf_specmm import testing
target = testing.tiny_target({FAMILY!r})
draft = hf_specmm.load_draft("org/tiny-with-mtp", kind="mtp", target=target)
expected = torch.load({str(tmp_path / 'expected.pt')!r})
assert all(torch.equal(draft.state_dict()[k], v) for k, v in expected.items())
print("read", draft.config.layout)
"""
    out = run_python(code, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert "read vllm" in out.stdout
