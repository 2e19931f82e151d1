"""Offline quickstart: speculative decoding on a tiny LLaVA built from configs (no downloads).

Runs plain greedy generate and hf_specmm speculative generate with three drafts on two batches, one of
text-only prompts and one of prompts with an image, checks that every output is identical to plain
generate, and prints τ (tokens per target forward) / acceptance. Random weights: the numbers show the
mechanics, not speed:

- an exact copy of the target's language model, used as a text-only draft, is always right on text-only
  prompts (acceptance 1.00: it sees everything the target sees), but on prompts with an image it is mostly
  wrong: a text-only draft reads the prompt with the image removed, and the target's answer depends on
  the image;
- the same copy behind an ``ImageAdapterDraft`` that reads the target's own image embeddings sees the
  image too, and is always right on both batches;
- a random draft (smaller vocabulary) is almost never right.

    python examples/offline_quickstart.py
"""

from __future__ import annotations

import torch

import hf_specmm
from hf_specmm import testing


def main() -> None:
    torch.manual_seed(0)
    family = "llava"
    model = testing.tiny_target(family, eos_bias=-30.0)
    processor = testing.tiny_processor(family)
    batches = {
        "text-only prompts": (["describe the sky and the tree", "how many dog are there ?"], [None, None]),
        "prompts with an image": (["what color is the circle ?", "describe the image"],
                                  [testing.tiny_image(0), testing.tiny_image(1, (64, 32))]),
    }
    copy_of_lm = testing.text_draft_from_target(model)
    drafts = {
        "text-only copy of the target's LM": copy_of_lm,
        "image-adapter draft around that copy": hf_specmm.ImageAdapterDraft.for_target(
            model, copy_of_lm, copy_projector=True),
        "random text-only draft (smaller vocab)": testing.random_text_draft(
            model, vocab_size=model.config.text_config.vocab_size - 4),
    }
    print(f"target: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, γ=5")
    for batch_name, (prompts, images) in batches.items():
        inputs = testing.make_inputs(family, processor, prompts, images)
        hf_specmm.disable(model)
        plain = model.generate(**inputs, max_new_tokens=32, do_sample=False)
        hf_specmm.enable(model)
        print(f"\n{batch_name} (batch {len(prompts)}):")
        for name, draft in drafts.items():
            out = model.generate(**inputs, max_new_tokens=32, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=5)
            s = hf_specmm.last_stats(model)
            same = torch.equal(out, plain)
            print(f"- {name}: identical to plain generate: {same}; τ={s.block_efficiency:.2f} "
                  f"acceptance={s.acceptance_rate:.2f} target forwards={s.target_forwards} "
                  f"for {s.generated_tokens} tokens")
            if not same:
                raise SystemExit("speculative output differs from plain generate")
        text = processor.batch_decode(plain[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        print("  first row's answer:", text[0])


if __name__ == "__main__":
    main()
