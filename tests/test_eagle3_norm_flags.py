"""speculators 0.9's EAGLE-3 norm options (``norm_before_fc``, ``fc_norm``, ``norm_output``): checkpoints written
from the layout's documented fields load with every key checked, and the head drafts what a plain-torch
reference of speculators' forward computes from the same files (a first step over the prompt, then a drafted
step reading the fed-back state); lossless in generate; exact round trips; mismatched keys refused by name
before any forward."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import hf_specmm
from hf_specmm import _compat
from hf_specmm.errors import DraftLoadError
from hf_specmm.drafts.feature_head.eagle3 import Eagle3FeatureHead
from conftest import target
from eagle3_fixtures import lagged_head
from test_eagle3_formats import _fixture, _run
from test_train import count_forwards

# (norm_before_fc, fc_norm, norm_output): each flag, and each norm before fc with EAGLE 3.1's fed-back norm
FLAGS = [(True, False, False), (False, True, False), (False, False, True), (True, False, True), (False, True, True)]


def _flag_ids(flags):
    return "+".join(n for n, on in zip(("norm_before_fc", "fc_norm", "norm_output"), flags) if on)


def _with_flags(folder, flags, seed=1):
    """Add the flags to a speculators fixture: config fields, and the norms' tensors under speculators' names
    with weights far from 1 (a norm silently skipped or applied twice changes the drafts)."""
    before, per_layer, output = flags
    config = json.loads((folder / "config.json").read_text())
    config.update(norm_before_fc=before, fc_norm=per_layer, norm_output=output)
    tensors = load_file(str(folder / "model.safetensors"))
    hidden = tensors["norm.weight"].numel()
    aux = len(config["eagle_aux_hidden_state_layer_ids"])
    gen = torch.Generator().manual_seed(seed)
    if before:
        tensors["input_norm.weight"] = 1 + 0.5 * torch.randn(aux * hidden, generator=gen)
    if per_layer:
        for i in range(aux):
            tensors[f"fc_norm.{i}.weight"] = 1 + 0.5 * torch.randn(hidden, generator=gen)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


# ---- a reference of speculators' Eagle3DraftModel forward, in plain torch, read from the checkpoint files ----
def _rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x, positions, theta):
    dim = x.shape[-1]
    angles = positions[:, None].double() * (1.0 / theta ** (torch.arange(0, dim, 2).double() / dim))[None]
    cos, sin = torch.cat([angles, angles], -1).cos().float(), torch.cat([angles, angles], -1).sin().float()
    half = torch.cat([-x[..., dim // 2:], x[..., : dim // 2]], -1)
    return x * cos[:, None] + half * sin[:, None]


def _reference_layer(w, cfg, embeds, feature, positions):
    """speculators' first layer over a causal sequence: attention reads [norm(embedding); hidden_norm(feature)],
    the residual stream starts from the raw feature (norm_before_residual false)."""
    eps, heads, kv, dim = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    x = torch.cat([_rms(embeds, w["layers.0.input_layernorm.weight"], eps), _rms(feature, w["layers.0.hidden_norm.weight"], eps)], -1)
    n = x.shape[0]
    q = _rotate((x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, heads, dim), positions, cfg["rope_theta"])
    k = _rotate((x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, kv, dim), positions, cfg["rope_theta"])
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, kv, dim)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * dim)
    hidden = feature + attended @ w["layers.0.self_attn.o_proj.weight"].T
    y = _rms(hidden, w["layers.0.post_attention_layernorm.weight"], eps)
    mlp = (F.silu(y @ w["layers.0.mlp.gate_proj.weight"].T) * (y @ w["layers.0.mlp.up_proj.weight"].T))
    return hidden + mlp @ w["layers.0.mlp.down_proj.weight"].T


def _reference_fuse(w, config, features, eps):
    if config["norm_before_fc"]:
        features = _rms(features, w["input_norm.weight"], eps)
    if config["fc_norm"]:
        parts = features.chunk(len(config["eagle_aux_hidden_state_layer_ids"]), -1)
        features = torch.cat([_rms(p, w[f"fc_norm.{i}.weight"], eps) for i, p in enumerate(parts)], -1)
    return features @ w["fc.weight"].T


def _reference_out(w, config, hidden, eps):
    """(the state fed to the next step, draft-vocabulary logits): EAGLE 3.1 feeds back the normed state."""
    normed = _rms(hidden, w["norm.weight"], eps)
    return (normed if config["norm_output"] else hidden), normed @ w["lm_head.weight"].T


@pytest.mark.parametrize("flags", FLAGS, ids=_flag_ids)
def test_published_flags_draft_what_speculators_computes(tmp_path, flags):
    model = target("llava")
    folder = _with_flags(_fixture(tmp_path / "ckpt", model, "speculators"), flags)
    config = json.loads((folder / "config.json").read_text())
    cfg = config["transformer_layer_config"]
    assert model.config.get_text_config().rope_parameters["rope_theta"] == cfg["rope_theta"]  # the head's positions
    w = load_file(str(folder / "model.safetensors"))
    head = hf_specmm.load_draft(folder, target=model)
    assert [head.config.norm_before_fc, head.config.fc_norm, head.config.norm_output] == list(flags)
    eps, table = cfg["rms_norm_eps"], model.get_input_embeddings().weight.detach()
    torch.manual_seed(3)
    n, hidden = 7, cfg["hidden_size"]
    ids = torch.randint(0, table.shape[0], (n,))
    features = 2 * torch.randn(n, 3 * hidden)  # the target layers' inputs at each slot
    positions = torch.arange(n)
    with torch.no_grad():
        # step 0 over the prompt (slot t: the token after t and the target's features at t), then one drafted step
        cache = _compat.new_dynamic_cache()
        out = head(features=features[None], input_ids=ids[None], position_ids=positions[None], cache=cache, use_cache=True)
        first = head.draft_logits(out.hidden_states[0, -1])
        token = int(first.argmax()) + int(head.d2t[first.argmax()])  # the target id it proposes
        nxt = head(features=out.hidden_states[:, -1:], input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[n]]),
                   cache=cache, use_cache=True)
        second = head.draft_logits(nxt.hidden_states[0, -1])

        fed0, logits0 = _reference_out(w, config, _reference_layer(w, cfg, table[ids], _reference_fuse(w, config, features, eps),
                                                                   positions), eps)
        ref_token = int(logits0[-1].argmax()) + int(w["d2t"][logits0[-1].argmax()])
        all_ids = torch.cat([ids, torch.tensor([ref_token])])
        feature1 = torch.cat([_reference_fuse(w, config, features, eps), fed0[-1:]])  # the drafted slot reads the fed-back state
        _, logits1 = _reference_out(w, config, _reference_layer(w, cfg, table[all_ids], feature1, torch.arange(n + 1)), eps)
    assert token == ref_token
    assert torch.allclose(first, logits0[-1], atol=1e-4), (first - logits0[-1]).abs().max()
    assert torch.allclose(second, logits1[-1], atol=1e-4), (second - logits1[-1]).abs().max()
    # the reference is sensitive to the flags: dropping them changes the drafted step
    plain = {**config, "norm_before_fc": False, "fc_norm": False, "norm_output": False}
    with torch.no_grad():
        fed, _ = _reference_out(w, plain, _reference_layer(w, cfg, table[ids], _reference_fuse(w, plain, features, eps), positions), eps)
        _, other = _reference_out(w, plain, _reference_layer(w, cfg, table[all_ids], torch.cat(
            [_reference_fuse(w, plain, features, eps), fed[-1:]]), torch.arange(n + 1)), eps)
    assert not torch.allclose(other[-1], logits1[-1], atol=1e-3)


def _flagged_head(model, flags):
    """The lagged head (drafts partly what the target says) with the flags' norms at weights far from 1."""
    base = lagged_head(model, draft_vocab_size=model.get_input_embeddings().weight.shape[0] // 2)
    before, per_layer, output = flags
    head = Eagle3FeatureHead.for_target(model, aux_layers=base.config.aux_layers, draft_vocab_size=base.d2t.numel(),
                                        norm_before_fc=before, fc_norm=per_layer, norm_output=output)
    head.load_state_dict({**head.state_dict(), **base.state_dict()})  # the base head's weights, the flags' norms new
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.startswith(("input_norm.", "fc_norm.")):
                p.copy_(1 + 0.3 * torch.rand_like(p))
    return head.eval()


@pytest.mark.parametrize("flags", FLAGS, ids=_flag_ids)
def test_flagged_heads_round_trip_exactly_and_stay_lossless(tmp_path, flags):
    model = target("llava")
    head = _flagged_head(model, flags)
    head.save_pretrained(tmp_path / "spec", format="speculators")
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert [config["norm_before_fc"], config["fc_norm"], config["norm_output"]] == list(flags)
    names = set(load_file(str(tmp_path / "spec" / "model.safetensors")))
    assert ("input_norm.weight" in names) == flags[0]
    assert ({f"fc_norm.{i}.weight" for i in range(3)} <= names) == flags[1]
    loaded = hf_specmm.load_draft(tmp_path / "spec", target=model)
    loaded.save_pretrained(tmp_path / "ours")
    again = hf_specmm.load_draft(tmp_path / "ours").attach(model)
    torch.manual_seed(4)
    features, ids = torch.randn(2, 6, 3 * head.fc.out_features), torch.randint(0, 60, (2, 6))
    with torch.no_grad():
        want = head(features=features, input_ids=ids, logits_to_keep=6)
        for other in (loaded, again):
            got = other(features=features, input_ids=ids, logits_to_keep=6)
            assert torch.equal(got.logits, want.logits) and torch.equal(got.hidden_states, want.hidden_states)
    out = _run(model, "llava", loaded)  # greedy == plain generate, batch 3 with left padding (asserted inside)
    assert out == _run(model, "llava", head)
    with pytest.raises(ValueError, match="format='speculators'"):
        head.save_pretrained(tmp_path / "sglang", format="sglang")


def _edit(folder, config=None, drop=(), add=None):
    if config:
        raw = json.loads((folder / "config.json").read_text())
        raw.update(config)
        (folder / "config.json").write_text(json.dumps(raw))
    tensors = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k not in drop}
    tensors.update(add or {})
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("flags, change, match", [
    ((True, False, False), {"drop": ["input_norm.weight"]}, r"norm_before_fc=true.*input_norm\.weight"),
    ((False, True, False), {"drop": ["fc_norm.1.weight"]}, r"missing \['fc_norm\.1\.weight'\]"),
    ((False, True, False), {"drop": ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]}, "fc_norm=true"),
    ((False, False, False), {"add": {"input_norm.weight": torch.ones(192)}}, r"\['input_norm\.weight'\].*norm_before_fc"),
    ((False, False, True), {"add": {"fc_norm.0.weight": torch.ones(64)}}, r"\['fc_norm\.0\.weight'\].*fc_norm"),
    ((False, True, False), {"add": {"fc_norm.3.weight": torch.ones(64)}}, r"unexpected \['fc_norm\.3\.weight'\]"),
    ((True, False, False), {"add": {"input_norm.weight": torch.ones(64)}}, r"input_norm\.weight is \[64\]"),
    ((True, False, False), {"config": {"fc_norm": True}}, "both norm_before_fc and fc_norm"),
    ((False, False, False), {"config": {"norm_output": "yes"}}, "norm_output must be true or false"),
])
def test_flag_mismatches_are_refused_by_name_before_any_forward(tmp_path, flags, change, match):
    model = target("llava")
    folder = _edit(_with_flags(_fixture(tmp_path / "ckpt", model, "speculators"), flags), **change)
    with count_forwards() as calls, pytest.raises(DraftLoadError, match=match):
        hf_specmm.load_draft(folder, target=model)
    assert calls["n"] == 0


def test_sglang_configs_with_the_flags_are_refused(tmp_path):
    model = target("llava")
    folder = _edit(_fixture(tmp_path / "ckpt", model, "sglang"), config={"norm_output": True})
    with pytest.raises(DraftLoadError, match=r"SGLang EAGLE-3 config with \['norm_output'\]"):
        hf_specmm.load_draft(folder, target=model)
    with pytest.raises(ValueError, match="exclusive"):
        Eagle3FeatureHead.for_target(model, norm_before_fc=True, fc_norm=True)
