"""Training data: JSONL lines ``{"image": <path or null>, "prompt": ..., "response": <optional>}`` checked
up front (missing / unreadable images name the file and the line), prompts formatted as the target
reads them, and micro-batches laid out for teacher-forced distillation.

    >>> examples = load_examples("data.jsonl", images="imgs/")  # doctest: +SKIP
    >>> train, heldout = split_heldout(examples, 0.1, seed=0)  # doctest: +SKIP

Batch layout: ``[left-padded prompt | response, right-padded]``, the layout of ``generate``'s own
left-padded prompts, so every row's response starts at the same column and positions are
given by the target family's position rule exactly as at inference (for the target and for the draft).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from .config import TrainingInputError


@dataclass
class Example:
    """One JSONL line. ``response_ids``: the target's answer as token ids (given, cached or generated)."""

    line: int  # 1-based line number in ``source``
    source: str
    prompt: str
    image: Path | None = None
    image_sha: str | None = None
    response: str | None = None
    task: str | None = None  # optional "task" field of the line (e.g. the miniature world's caption/vqa/reasoning)
    response_ids: list[int] | None = None

    def load_image(self) -> Image.Image | None:
        return None if self.image is None else Image.open(self.image).convert("RGB")


def _image_sha(path: Path, memo: dict[Path, str]) -> str:
    if path not in memo:
        memo[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return memo[path]


def load_examples(data: str | Path, images: str | Path | None = None) -> list[Example]:
    """Parse and check every line; raise :class:`TrainingInputError` on the first problem (no model touched)."""
    data = Path(data)
    if not data.is_file():
        raise TrainingInputError(f"data file {data} does not exist")
    root = Path(images) if images is not None else data.parent
    examples, memo = [], {}
    for number, raw in enumerate(data.read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{data.name} line {number}"
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as err:
            raise TrainingInputError(f"{where}: not valid JSON ({err.msg})") from err
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise TrainingInputError(f"{where}: needs a non-empty string \"prompt\"")
        image, response = item.get("image"), item.get("response")
        if image is not None and not isinstance(image, str):
            raise TrainingInputError(f"{where}: \"image\" must be a path or null, got {image!r}")
        if response is not None and not isinstance(response, str):
            raise TrainingInputError(f"{where}: \"response\" must be a string when given")
        task = item.get("task")
        example = Example(number, data.name, item["prompt"], response=response,
                          task=task if isinstance(task, str) else None)
        if image is not None:
            path = Path(image) if Path(image).is_absolute() else root / image
            if not path.is_file():
                raise TrainingInputError(f"{where}: image file {image!r} not found (looked for {path})")
            try:
                with Image.open(path) as img:  # reads the header only
                    img.size
            except (UnidentifiedImageError, OSError) as err:
                raise TrainingInputError(f"{where}: image file {image!r} is not a readable image ({err})") from err
            example.image, example.image_sha = path, _image_sha(path, memo)
        examples.append(example)
    if not examples:
        raise TrainingInputError(f"{data} holds no examples (empty dataset)")
    return examples


def split_heldout(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded split: ``round(fraction · N)`` examples (at least one when fraction > 0) are held out."""
    if fraction <= 0 or len(examples) < 2:
        return list(examples), []
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n = min(max(1, round(fraction * len(examples))), len(examples) - 1)
    held = set(order[:n])
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def format_prompt(processor: Any, example: Example, prompt_format: str) -> str:
    """The text the processor gets: the chat template with one user turn, or the raw prompt (with the
    image token prepended when the line has an image and the prompt does not mention it)."""
    image_token = getattr(processor, "image_token", "<image>")
    use_chat = prompt_format == "chat" or (prompt_format == "auto" and getattr(processor, "chat_template", None))
    if use_chat:
        content: list[dict] = [{"type": "image"}] if example.image is not None else []
        content.append({"type": "text", "text": example.prompt})
        return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
    if example.image is not None and image_token not in example.prompt:
        return f"{image_token} {example.prompt}"
    return example.prompt


def encode_prompts(processor: Any, examples: list[Example], prompt_format: str, device: Any) -> dict[str, torch.Tensor]:
    """Left-padded processor inputs (input_ids, attention_mask, pixel_values, ...) for ``examples``."""
    texts = [format_prompt(processor, e, prompt_format) for e in examples]
    images = [e.load_image() for e in examples]
    # each row's images as a list (Gemma 3's processor requires it; the LLaVA processors read it the same)
    nested = [[] if img is None else [img] for img in images] if any(img is not None for img in images) else None
    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # generate's layout
    try:
        inputs = processor(images=nested, text=texts, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    return {k: v.to(device) for k, v in inputs.items()}


@dataclass
class Batch:
    """One micro-batch. ``full_*``: [B, P + R] prompt then response; ``response_*``: [B, R]."""

    inputs: dict[str, torch.Tensor]  # processor outputs of the prompts (pixel_values, image_sizes, ...)
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor
    full_ids: torch.Tensor
    full_mask: torch.Tensor
    response_ids: torch.Tensor  # [B, R] right-padded
    response_mask: torch.Tensor  # bool

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum())


def make_batch(processor: Any, examples: list[Example], prompt_format: str, pad_id: int, device: Any) -> Batch:
    inputs = encode_prompts(processor, examples, prompt_format, device)
    prompt_ids, prompt_mask = inputs.pop("input_ids"), inputs.pop("attention_mask").long()
    width = max(len(e.response_ids or ()) for e in examples)
    response = torch.full((len(examples), width), pad_id, dtype=torch.long, device=device)
    response_mask = torch.zeros(len(examples), width, dtype=torch.bool, device=device)
    for i, e in enumerate(examples):
        ids = e.response_ids or []
        response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[i, : len(ids)] = True
    return Batch(inputs, prompt_ids, prompt_mask, torch.cat([prompt_ids, response], 1),
                 torch.cat([prompt_mask, response_mask.long()], 1), response, response_mask)


class Sampler:
    """Deterministic draws: the k-th draw from a pool is element ``perm_epoch[k mod N]`` of a permutation
    seeded by (seed, pool, epoch = k div N). Its whole state is a counter per pool (saved in checkpoints).
    Under several processes every process draws the whole global batch (and trains its slice of it), so the
    counters count global draws: a checkpoint resumes on any number of processes with the same global batch."""

    def __init__(self, pools: dict[str, list[Example]], seed: int):
        self.pools, self.seed = pools, seed
        self.drawn = {name: 0 for name in pools}
        self._perms: dict[tuple[str, int], list[int]] = {}

    def draw(self, pool: str, n: int) -> list[Example]:
        items, out = self.pools[pool], []
        for _ in range(n):
            epoch, k = divmod(self.drawn[pool], len(items))
            key = (pool, epoch)
            if key not in self._perms:
                order = list(range(len(items)))
                random.Random(f"{self.seed}/{pool}/{epoch}").shuffle(order)
                self._perms = {key: order}  # only the current epoch's permutation is kept
            out.append(items[self._perms[key][k]])
            self.drawn[pool] += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return dict(self.drawn)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.drawn.update({k: int(v) for k, v in state.items() if k in self.drawn})
