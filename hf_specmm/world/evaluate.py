"""How well the world target answers: exact-match accuracy per task on held-out scenes, and the same
questions asked about *other* scenes' images (a control: if the answers depend on the image, accuracy drops).

Example::

    >>> from hf_specmm.world.evaluate import answer_accuracy
    >>> answer_accuracy(model, processor, load_examples("world/heldout.jsonl"))  # doctest: +SKIP
    {'caption': 0.97, 'vqa': 0.99, 'reasoning': 0.95, 'all': 0.97}
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..train.data import Example, encode_prompts
from .target import MAX_ANSWER_TOKENS


def unseen(heldout: list[Example], train: list[Example]) -> list[Example]:
    """The held-out lines whose image is not byte-identical to a training image (single-object scenes repeat:
    there are only 3 shapes × 6 colours × 2 sizes × 9 cells = 324 of them)."""
    seen = {e.image_sha for e in train}
    return [e for e in heldout if e.image_sha not in seen]


@torch.no_grad()
def generate_answers(model: Any, processor: Any, examples: list[Example], max_new_tokens: int = MAX_ANSWER_TOKENS,
                     batch_size: int = 32, **generate_kwargs: Any) -> list[str]:
    """Greedy answers (decoded, special tokens dropped), batched with left padding."""
    answers = []
    for start in range(0, len(examples), batch_size):
        inputs = encode_prompts(processor, examples[start:start + batch_size], "raw", model.device)
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
        answers += processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return [a.strip() for a in answers]


def answer_accuracy(model: Any, processor: Any, examples: list[Example], shuffle_images: bool = False,
                    batch_size: int = 32) -> dict[str, float]:
    """Share of answers equal to the reference, per task and over ``"all"`` (exact string match).

    ``shuffle_images``: line i is asked about line i+1's image (rotated), scored against line i's answer.
    """
    if not examples or any(e.response is None for e in examples):
        raise ValueError("answer_accuracy needs examples with a reference \"response\"")
    asked = examples
    if shuffle_images:
        images = [e.image for e in examples]
        asked = [dataclasses.replace(e, image=img) for e, img in zip(examples, images[1:] + images[:1])]
    answers = generate_answers(model, processor, asked, batch_size=batch_size)
    hits: dict[str, list[bool]] = {}
    for e, answer in zip(examples, answers):
        hit = answer == e.response.strip()
        hits.setdefault(e.task or "all", []).append(hit)
        if e.task:
            hits.setdefault("all", []).append(hit)
    return {task: round(sum(v) / len(v), 4) for task, v in sorted(hits.items())}
