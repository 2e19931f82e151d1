"""EAGLE-3 heads for the tests (built offline from a tiny target; no training)."""

from __future__ import annotations

import torch

import hf_specmm


def lagged_head(target, draft_vocab_size: int | None = None, seed: int = 1):
    """An EAGLE-3 head that proposes what the target would say *after its last true token*: ``fc`` picks the
    output of the target's last decoder layer, the head's attention and MLP add nothing, and its norm and LM
    head are the target's. It agrees with the target wherever the target repeats itself (often, for the
    tiny targets): partial acceptance, rollbacks at different offsets per row."""
    torch.manual_seed(seed)
    depth = target.config.get_text_config().num_hidden_layers
    head = hf_specmm.FeatureHeadDraft.for_target(target, variant="eagle3", aux_layers=[0, depth // 2, depth],
                                                 draft_vocab_size=draft_vocab_size)
    lm = target.get_decoder()
    hidden = head.fc.out_features
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * hidden:] = torch.eye(hidden)
        for layer in head.body.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        norm = lm.norm.weight
        # Gemma / Gemma 3's norm multiplies by (1 + w) (Gemma 4's by w): the head's Llama norm multiplies by w
        name = type(lm.norm).__name__
        head.norm.weight.copy_(norm + 1 if "Gemma" in name and not name.startswith("Gemma4") else norm)
        head.norm.variance_epsilon = lm.norm.eps if hasattr(lm.norm, "eps") else lm.norm.variance_epsilon
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.draft_ids])
    return head.eval()
