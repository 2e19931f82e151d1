"""Offline quickstart: speculative decoding on a tiny LLaVA built from configs (no downloads).

Runs plain greedy generate and hf_specmm speculative generate with two text-only drafts, checks that
the outputs are identical, and prints τ / acceptance. Random weights: the numbers show the mechanics
(the exact copy of the target's LM is always right on text, a random draft almost never), not speed.

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
    images = [testing.tiny_image(0), None, testing.tiny_image(1, (64, 32))]
    prompts = ["what color is the circle ?", "describe the image", "how many dog are there ?"]
    inputs = testing.make_inputs(family, processor, prompts, images)

    plain = model.generate(**inputs, max_new_tokens=32, do_sample=False)
    hf_specmm.enable(model)
    drafts = {
        "text-only copy of the target's LM": testing.text_draft_from_target(model),
        "random text-only draft (smaller vocab)": testing.random_text_draft(
            model, vocab_size=model.config.text_config.vocab_size - 4),
    }
    print(f"target: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, batch 3")
    for name, draft in drafts.items():
        out = model.generate(**inputs, max_new_tokens=32, do_sample=False, assistant_model=draft, num_assistant_tokens=5)
        s = hf_specmm.last_stats(model)
        same = torch.equal(out, plain)
        print(f"- {name}: identical to plain generate: {same}; τ={s.block_efficiency:.2f} "
              f"acceptance={s.acceptance_rate:.2f} target forwards={s.target_forwards} for {s.generated_tokens} tokens")
        if not same:
            raise SystemExit("speculative output differs from plain generate")
    text = processor.batch_decode(plain[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    print("first row's answer:", text[0])


if __name__ == "__main__":
    main()
