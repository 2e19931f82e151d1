"""EAGLE-3 heads in the serving engines' layouts: export to ``speculators`` (vLLM) and SGLang / SpecForge, import
through ``load_draft(path, target=...)``, round trips with identical outputs and acceptance, fixtures written
from the formats' documented fields, mismatches refused before any forward, and no code run from a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import hf_specmm
from hf_specmm import IncompatibleDraftError, SpecMMError
from conftest import batch_inputs, target
from eagle3_fixtures import lagged_head
from test_train import count_forwards

SPECULATORS_TENSORS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}


def _run(model, family, head):
    inputs = batch_inputs(family, 3)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=head, num_assistant_tokens=4)
        stats = hf_specmm.last_stats(model)
        hf_specmm.disable(model)
        plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)
    return out.tolist(), stats.acceptance_rate, stats.tokens_per_round


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
@pytest.mark.parametrize("layout", ["speculators", "sglang"])
def test_round_trip_gives_identical_drafts(tmp_path, family, layout):
    model = target(family)
    head = lagged_head(model, draft_vocab_size=model.get_input_embeddings().weight.shape[0] // 2)
    head.save_pretrained(tmp_path / layout, format=layout)
    config = json.loads((tmp_path / layout / "config.json").read_text())
    with safe_open(str(tmp_path / layout / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and int(t2d.sum()) == d2t.numel()
    assert torch.equal(torch.arange(d2t.numel()) + d2t, t2d.nonzero().squeeze(-1))  # target id = draft id + d2t
    if layout == "speculators":
        assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == d2t.numel()
        assert config["eagle_aux_hidden_state_layer_ids"] == head.config.aux_layers
        assert config["transformer_layer_config"]["vocab_size"] == t2d.numel()
        assert SPECULATORS_TENSORS | {"layers.0.hidden_norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [k - 1 for k in head.config.aux_layers]
        assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "fc.weight"} <= names
        if family == "qwen2_5_vl":
            assert config["rope_scaling"]["mrope_section"] == model.config.get_text_config().rope_parameters["mrope_section"]
    assert q_proj_width(tmp_path / layout, layout) == 2 * head.fc.out_features
    assert not any("embed" in n for n in names)
    loaded = hf_specmm.load_draft(tmp_path / layout, target=model)
    assert type(loaded) is type(head) and loaded.config.aux_layers == head.config.aux_layers
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in head.state_dict().items())
    assert _run(model, family, head) == _run(model, family, loaded)
    # and back into hf_specmm's own layout
    loaded.save_pretrained(tmp_path / "ours")
    again = hf_specmm.load_draft(tmp_path / "ours")
    assert _run(model, family, again) == _run(model, family, head)


def q_proj_width(folder, layout):
    name = "layers.0.self_attn.q_proj.weight" if layout == "speculators" else "midlayer.self_attn.q_proj.weight"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.get_tensor(name).shape[1]


def _fixture(folder, model, layout, hidden=None, vocab=None, draft_vocab=24, aux=(0, 1, 2), layers=1, seed=0):
    """A checkpoint written from the format's documented fields only (no hf_specmm code)."""
    text = model.config.get_text_config()
    hidden = hidden or text.hidden_size
    vocab = vocab or model.get_input_embeddings().weight.shape[0]
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", heads)
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    gen = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (0.1 * torch.randn(*shape, generator=gen)).contiguous()

    layer_cfg = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden,
                 "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
                 "head_dim": head_dim, "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": vocab,
                 "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": False}
    prefix0 = "layers.0." if layout == "speculators" else "midlayer."
    tensors = {"fc.weight": w(hidden, 3 * hidden), "norm.weight": 1 + w(hidden), "lm_head.weight": w(draft_vocab, hidden)}
    for i in range(layers):
        p = prefix0 if i == 0 else (f"layers.{i}." if layout == "speculators" else f"additional_layers.{i - 1}.")
        width = 2 * hidden if i == 0 else hidden
        tensors.update({p + "self_attn.q_proj.weight": w(heads * head_dim, width),
                        p + "self_attn.k_proj.weight": w(kv * head_dim, width),
                        p + "self_attn.v_proj.weight": w(kv * head_dim, width),
                        p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
                        p + "mlp.gate_proj.weight": w(2 * hidden, hidden), p + "mlp.up_proj.weight": w(2 * hidden, hidden),
                        p + "mlp.down_proj.weight": w(hidden, 2 * hidden), p + "post_attention_layernorm.weight": 1 + w(hidden)})
        tensors[p + ("input_layernorm.weight" if i == 0 or layout == "speculators" else "hidden_norm.weight")] = 1 + w(hidden)
        if i == 0:
            tensors[p + "hidden_norm.weight"] = 1 + w(hidden)
    ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    tensors["d2t"], tensors["t2d"] = ids - torch.arange(draft_vocab), torch.zeros(vocab, dtype=torch.bool).index_fill(0, ids, True)
    if layout == "speculators":
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": layer_cfg, "draft_vocab_size": draft_vocab, "norm_before_residual": False,
                  "eagle_aux_hidden_state_layer_ids": list(aux),
                  "auto_map": {"AutoConfig": "broken_code.Config", "AutoModel": "broken_code.Model"},
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                         "verifier": {"name_or_path": "org/target", "architectures": ["X"]}}}
    else:
        config = {**layer_cfg, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in aux]},
                  "auto_map": {"AutoModelForCausalLM": "broken_code.Model"}}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "broken_code.py").write_text("raise RuntimeError('checkpoint code was executed')\n")
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
@pytest.mark.parametrize("layout", ["speculators", "sglang"])
def test_published_layouts_draft_losslessly_and_run_no_code(tmp_path, family, layout):
    """Fixtures written from the documented fields (with an ``auto_map`` to a module that raises on import)
    load without running it and draft losslessly (two layers: SGLang's additional layers too)."""
    model = target(family)
    folder = _fixture(tmp_path / "ckpt", model, layout, layers=2)
    head = hf_specmm.load_draft(folder, target=model)
    assert hf_specmm.kind_of(head).name == "eagle3" and head.config.aux_layers == [0, 1, 2]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert torch.equal(head.lm_head.weight, f.get_tensor("lm_head.weight"))
        key = "layers.1.input_layernorm.weight" if layout == "speculators" else "additional_layers.0.hidden_norm.weight"
        assert torch.equal(head.body.layers[1].input_layernorm.weight, f.get_tensor(key))
    _run(model, family, head)
    with pytest.raises(SpecMMError, match="target="):
        hf_specmm.load_draft(folder)


@pytest.mark.parametrize("change, match", [({"hidden": 48}, "hidden size 48"), ({"vocab": 999}, "vocabulary of 999"),
                                           ({"aux": (0, 1, 7)}, "auxiliary layers \\[0, 1, 7\\]")])
def test_a_checkpoint_for_another_target_is_refused_before_any_forward(tmp_path, change, match):
    model = target("llava")
    folder = _fixture(tmp_path / "ckpt", model, "speculators", **change)
    with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match=match):
        hf_specmm.load_draft(folder, target=model)
    assert calls["n"] == 0


def test_export_refusals_and_pickles(tmp_path):
    model = target("llava")
    head = lagged_head(model)
    with pytest.raises(ValueError, match="format='onnx'"):
        head.save_pretrained(tmp_path / "x", format="onnx")
    folder = _fixture(tmp_path / "ckpt", model, "sglang")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(SpecMMError, match="safetensors"):
        hf_specmm.load_draft(folder, target=model)


def test_a_head_on_one_target_layer_is_refused_where_it_is_made_or_read(tmp_path):
    """With one aux layer, fc's input has the width of the head's own fed-back features (the head tells them apart
    by width): refused when built, when a speculators checkpoint names one layer, and in an hf_specmm config."""
    from hf_specmm.drafts.feature_head import FeatureHeadDraft
    from hf_specmm.errors import DraftLoadError

    model = target("llava")
    with pytest.raises(ValueError, match=r"aux_layers=\[1\]: an EAGLE-3 head fuses two or more target layers"):
        FeatureHeadDraft.for_target(model, variant="eagle3", aux_layers=[1])
    folder = _fixture(tmp_path / "spec", model, "speculators", aux=(1,))
    with count_forwards() as calls, pytest.raises(DraftLoadError, match=r"aux_layers=\[1\]: an EAGLE-3 head fuses"):
        hf_specmm.load_draft(folder, target=model)
    assert calls["n"] == 0
    own = tmp_path / "own"
    lagged_head(model).save_pretrained(own)
    config = json.loads((own / "config.json").read_text())
    (own / "config.json").write_text(json.dumps({**config, "aux_layers": [1]}))
    with pytest.raises(DraftLoadError, match=r"aux_layers=\[1\]: an EAGLE-3 head fuses"):
        hf_specmm.load_draft(own, target=model)
