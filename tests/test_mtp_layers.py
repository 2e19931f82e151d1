"""Multi-layer MTP checkpoints: draft step k runs MTP layer k, every later step the last layer; layer k reads layer
k - 1's outputs as transformers' ``MtpModel`` chains them. Read from vLLM's layout (``mtp.layers.{k}``, one ``fc``
and set of norms for all) and transformers' (``layers.{N+k}.eh_proj`` ..., per layer); the proposals of a round
equal an uncached reference of that chain; greedy parity at batch 3 (left padding, a row without an image) and
sampling (χ²; trees, static caches and ``Auto``: tests/test_mtp.py); a declared count the tensors contradict is
refused naming the file and the tensor; Qwen3.5-MoE's MTP layer, its experts stored one tensor each (greedy
parity on a tiny Qwen3.5-MoE target)."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.drafts.mtp import MtpDraft
from hf_specmm.errors import DraftLoadError
from conftest import batch_inputs, target
from test_mtp import drafted_logits, generate
from test_sampling import assert_sampling_matches_plain

FAMILY = "llava"
NEW = 16
LAYERS = 3


@pytest.fixture(scope="module")
def model():
    return target(FAMILY)


def checkpoint(folder, model, layout, layers=LAYERS, **kwargs):
    made = testing.mtp_from_target(model, noise=0.1, layers=layers, shared=layout == "vllm")
    return testing.write_mtp_checkpoint(model, made, folder / layout, layout=layout, count=layers, **kwargs), made


@pytest.mark.parametrize("layout", ("vllm", "transformers"))
def test_reads_every_layer_and_keeps_greedy_parity(tmp_path, model, layout):
    folder, made = checkpoint(tmp_path, model, layout)
    draft = hf_specmm.load_draft(str(folder), kind="mtp", target=model)
    assert isinstance(draft, MtpDraft) and draft.config.num_layers == LAYERS and len(draft.mtp_layers) == LAYERS
    for name, tensor in made.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
    layers = draft.mtp_layers  # distinct layers (the noise differs per layer)
    assert not torch.equal(layers[1].body.layers[0].mlp.up_proj.weight, layers[2].body.layers[0].mlp.up_proj.weight)
    shared = torch.equal(layers[1].fc.weight, layers[0].fc.weight)
    assert shared == (layout == "vllm")
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    for gamma in (1, 3, 5):  # 5: steps 3 and 4 run the last layer again
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), (layout, gamma)
        assert 0.05 < stats.acceptance_rate < 0.95, stats.acceptance_rate


def reference(draft, model, ids: torch.Tensor, gamma: int) -> list[torch.Tensor]:
    """The chain, written out as transformers' ``MtpModel`` runs it, without a cache, for one text row of L tokens:
    layer k reads the pairs (layer k - 1's output at t, or the target's f_t for layer 0; x_{t+k+1}), t < L, at
    step k; past the last layer, the last one continues its own sequence with its output fed back."""
    with torch.no_grad():
        hidden = model.model.language_model(input_ids=ids).last_hidden_state[0]
        x = ids[0].tolist() + [int(model.lm_head(hidden[-1]).argmax())]
        length, layers = ids.shape[1], draft.mtp_layers
        outputs, proposals = [], []
        for step in range(gamma):
            layer = layers[min(step, len(layers) - 1)]
            if step < len(layers):
                features = hidden if step == 0 else outputs[step - 1]
                tokens = x[step + 1: step + 1 + length]
            else:
                features, tokens = torch.cat([features, outputs[-1][-1:]]), tokens + [x[-1]]
            embeds = model.get_input_embeddings()(torch.tensor(tokens))
            fused = layer.fc(torch.cat([layer.pre_fc_norm_embedding(embeds), layer.pre_fc_norm_hidden(features)], -1))
            out = layer.body(inputs_embeds=fused[None], position_ids=torch.arange(len(tokens))[None],
                             use_cache=False).last_hidden_state[0]
            outputs.append(out)
            proposals.append(model.lm_head(out[-1]))
            x.append(int(proposals[-1].argmax()))
    return proposals


def test_step_k_runs_layer_k_then_the_last_layer(model):
    draft = testing.mtp_from_target(model, noise=0.3, layers=LAYERS)
    inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), ["what color is the sky and the tree ?"],
                                 [None])
    gamma = LAYERS + 2
    _, seen = drafted_logits(model, inputs, draft, num_assistant_tokens=gamma)
    expected = reference(draft, model, inputs["input_ids"], gamma)
    for step, logits in enumerate(expected):  # the first round: the pending read, then its own drafts read
        proposable = seen[step][0].isfinite()  # ids a draft never proposes (placeholders, ...) are -inf
        assert proposable.sum() > 100
        torch.testing.assert_close(seen[step][0][proposable], logits.float()[proposable], rtol=1e-4, atol=1e-4)
    # each layer matters: the same weights in another order propose otherwise
    swapped = testing.mtp_from_target(model, noise=0.3, layers=LAYERS)
    swapped.later_layers[0].load_state_dict(draft.later_layers[1].state_dict())
    swapped.later_layers[1].load_state_dict(draft.later_layers[0].state_dict())
    _, other = drafted_logits(model, inputs, swapped, num_assistant_tokens=gamma)
    torch.testing.assert_close(other[0], seen[0])  # step 0: layer 0 in both
    assert not torch.allclose(other[1], seen[1], atol=1e-3)


def test_sampling_has_the_targets_distribution():
    model = testing.tiny_target(FAMILY, seed=0, eos_bias=-30.0)
    assert_sampling_matches_plain(model, FAMILY, testing.mtp_from_target(model, noise=0.3, layers=2), "mtp-2")


def test_saved_and_refused(tmp_path, model):
    draft = testing.mtp_from_target(model, noise=0.1, layers=2)
    draft.save_pretrained(tmp_path / "saved")
    assert "draft step k runs layer k" in (tmp_path / "saved" / "README.md").read_text()
    loaded = hf_specmm.load_draft(str(tmp_path / "saved"), target=model)
    assert loaded.config.num_layers == 2
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="one MTP layer"):
        draft.save_pretrained(tmp_path / "spec", format="speculators")

    def refused(folder, *needles):
        with pytest.raises(DraftLoadError) as info:
            hf_specmm.load_draft(str(folder), kind="mtp", target=model)
        for needle in needles:
            assert needle in str(info.value), (needle, str(info.value))

    depth = model.config.get_text_config().num_hidden_layers
    # two layers' tensors, one declared: the second layer's tensor is named, with its file
    folder, _ = checkpoint(tmp_path / "fewer", model, "transformers", layers=2)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["text_config"]["num_mtp_layers"] = 1
    path.write_text(json.dumps(config))
    refused(folder, "num_mtp_layers=1", "layers [0, 1]", "model-mtp.safetensors", f"layers.{depth + 1}.")
    # three declared, two stored
    folder, _ = checkpoint(tmp_path / "more", model, "vllm", layers=2)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    refused(folder, "mtp_num_hidden_layers=3", "layers [0, 1]", "model-mtp.safetensors")


def test_qwen3_5_moe_mtp_layer_with_per_expert_tensors(tmp_path):
    """Qwen3.5-MoE's MTP layer in vLLM's layout, its experts stored one tensor each (as its checkpoints do): read
    into the MoE decoder layer's fused experts, equal to the layer written; the draft steps on the target's
    features, and keeps greedy parity at batch 3 (left padding, a row without an image, the hybrid rollback)."""
    family = "qwen3_5_moe"
    if family not in testing.FIXTURES:
        pytest.skip("this transformers has no Qwen3.5-MoE")
    model = testing.tiny_target(family, eos_bias=-30.0)
    made = testing.mtp_from_target(model, noise=0.3)
    assert made.body.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    folder = testing.write_mtp_checkpoint(model, made, tmp_path / "moe", experts="per_expert")
    stored = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "mtp.layers.0.mlp.experts.3.up_proj.weight" in stored and "mtp.layers.0.mlp.gate.weight" in stored
    draft = hf_specmm.load_draft(str(folder), kind="mtp", target=model)
    for name, tensor in made.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
    ids = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = model.model.language_model(input_ids=ids).last_hidden_state
        out = draft(features=features, input_ids=ids, logits_to_keep=1)
        expected = made(features=features, input_ids=ids, logits_to_keep=1)
    assert torch.equal(out.logits, expected.logits) and out.logits.isfinite().all()
    inputs = testing.make_inputs(family, testing.tiny_processor(family),
                                 ["describe the image", "what color is the sky and the tree ?", "hi"],
                                 [testing.tiny_image(0), None, testing.tiny_image(2)])
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=NEW, do_sample=False)
    out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=3)
    assert torch.equal(out, plain) and 0 < stats.accepted_tokens < stats.drafted_tokens
    # an expert missing: named with its file
    _drop = stored.pop("mtp.layers.0.mlp.experts.2.gate_proj.weight")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": stored}))
    with pytest.raises(DraftLoadError, match=f"{_drop}.*experts of body.layers.0.mlp.experts.gate_up_proj"):
        hf_specmm.load_draft(str(folder), kind="mtp", target=model)

