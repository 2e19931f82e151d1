"""Step3.7's own MTP layers (transformers' layout, ``num_nextn_predict_layers``; a MoE layer or dense ones) read
with ``load_draft(<checkpoint>, kind="mtp", target=model)``: the first round's proposals equal stock's
``generate(use_mtp=True)`` (batch 1, where stock runs: transformers 5.25; its chain of exactly the checkpoint's
layer count), and
greedy output equals plain ``generate`` at batch 3 with images, left padding and a row without one."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from packaging.version import Version

from hf_specmm import _compat, testing, versions
from conftest import batch_inputs
from test_mtp import drafted_logits, generate

FAMILY = "step3p7"

if not _compat.STEP3P7_SUPPORTED:
    pytest.skip("this transformers has no Step3.7", allow_module_level=True)
# 5.17's MtpModel calls Step3.7's rotary embedding without its ``layer_type`` (a TypeError): stock's use_mtp runs
# Step3.7 from 5.25 on
STOCK_MTP = versions.INSTALLED >= Version("5.25.0.dev0")


def checkpoint(folder, layers: int, mlp: str, experts: str | None = None):
    """A tiny Step3.7 saved with ``layers`` MTP layers of MLP kind ``mlp`` (copies of a target layer of that kind,
    perturbed; ``experts="step3p7"``: MoE tensors under Step3.7's own names), and the target loaded back from it
    (as a user loads it: its config declares the MTP layers)."""
    from transformers import Step3p7ForConditionalGeneration

    base = testing.tiny_target(FAMILY, eos_bias=-30.0)
    kinds = base.config.text_config.mlp_layer_types
    made = testing.mtp_from_target(base, noise=0.1, layers=layers, copy_layer=kinds.index(mlp),
                                   mlp_layer_types=[mlp] * layers)
    testing.write_mtp_checkpoint(base, made, folder, layout="transformers", count=layers,
                                 count_field="num_nextn_predict_layers",
                                 extra_config={"mtp_layer_types": ["full_attention"] * layers,
                                               "mtp_mlp_layer_types": [mlp] * layers}, experts=experts)
    stored = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.endswith(f"layers.{len(kinds)}.moe.gate_proj.weight") for k in stored) == (experts == "step3p7")
    return Step3p7ForConditionalGeneration.from_pretrained(folder).eval(), made, kinds


def stock_proposals(model, inputs):
    """The candidate logits of stock's MTP generator in its first round (one per MTP layer)."""
    from transformers.generation import candidate_generator

    seen, real = [], candidate_generator.MTPCandidateGenerator.get_candidates

    def record(self, *args, **kwargs):
        ids, logits = real(self, *args, **kwargs)
        if logits is not None:
            seen.append(logits)
        return ids, logits

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidate_generator.MTPCandidateGenerator, "get_candidates", record)
        out = _compat.stock_generate(model, **inputs, max_new_tokens=8, do_sample=False, use_mtp=True)
    return out, seen[0][0]


@pytest.mark.parametrize("layers, mlp, experts", ((1, "sparse", None), (1, "sparse", "step3p7"), (3, "dense", None)))
def test_first_round_equals_stocks_use_mtp_and_greedy_parity(tmp_path, layers, mlp, experts):
    model, made, kinds = checkpoint(tmp_path / "ckpt", layers, mlp, experts)
    draft = hf_specmm.load_draft(str(tmp_path / "ckpt"), kind="mtp", target=model)
    assert draft.config.num_layers == layers and draft.config.text_config.mlp_layer_types == [mlp] * layers
    for name, tensor in made.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
    if STOCK_MTP:
        inputs = testing.make_inputs(FAMILY, testing.tiny_processor(FAMILY), ["what color is the sky and the tree ?"],
                                     [None])
        stock_out, stock = stock_proposals(model, inputs)
        _, ours = drafted_logits(model, inputs, draft, num_assistant_tokens=layers)
        assert stock.shape[0] == layers
        for step in range(layers):
            proposable = ours[step][0].isfinite()  # ids a draft never proposes (placeholders, ...) are -inf
            assert proposable.sum() > 100
            torch.testing.assert_close(ours[step][0][proposable], stock[step].float()[proposable], rtol=1e-4,
                                       atol=1e-4)
        plain = _compat.stock_generate(model, **inputs, max_new_tokens=8, do_sample=False)
        assert torch.equal(stock_out, plain)
    # batch 3: images, left padding, a row without an image; chains past the last layer and a tree
    inputs = batch_inputs(FAMILY, 3)
    plain = _compat.stock_generate(model, **inputs, max_new_tokens=16, do_sample=False)
    accepted = 0
    for gamma in (1, layers + 2):
        out, stats = generate(model, inputs, assistant_model=draft, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), gamma
        accepted += stats.accepted_tokens
    # copies of the target's last layer agree in part (the fixture shapes its last layer); its MoE layer's do not
    assert accepted > 0 or kinds[-1] != mlp
    tree, _ = generate(model, inputs, assistant_model=hf_specmm.Tree(draft, top_k=2, depth=3, nodes=6))
    assert torch.equal(tree, plain)
