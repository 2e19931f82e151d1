"""Three task types over a scene (after 2404.08856): ``caption``, ``vqa`` and ``reasoning``.

Every text is lowercase words and punctuation separated by single spaces. All fixed words live in
``TEMPLATES`` (slots are whole ``{name}`` tokens) and every slot is filled from ``SLOT_WORDS`` or from
another template, so ``tokenizer.world_vocabulary`` covers all outputs by construction.

Example::

    >>> import random
    >>> from hf_specmm.world.scenes import Scene, SceneObject
    >>> scene = Scene([SceneObject("circle", "red", "large", "top", "left")])
    >>> vqa(scene, random.Random(0), kind="color")
    ('what color is the circle ?', 'red')
    >>> make_example(scene, "caption", random.Random(0))["answer"]
    'an image with one object : a large red circle in the top left .'
"""

from __future__ import annotations

import random
from typing import Any

from .scenes import COLOURS, COLUMNS, PLURALS, ROWS, SHAPES, SIZES, Scene, SceneObject, render

TASKS: tuple[str, ...] = ("caption", "vqa", "reasoning")
NUMBERS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
VQA_KINDS: tuple[str, ...] = ("color", "count", "exists")
REASONING_KINDS: tuple[str, ...] = ("compare", "colour_count", "total")

TEMPLATES: dict[str, str] = {
    # caption
    "caption_prompt_0": "describe the image .",
    "caption_prompt_1": "write a short caption for the picture .",
    "caption_prompt_2": "what is in the image ?",
    "caption_one": "an image with one object : {objects} .",
    "caption_many": "an image with {n} objects : {objects} .",
    "object": "a {size} {colour} {shape} in the {row} {column}",
    "list_sep": ",",
    "list_last": "and",
    # vqa
    "vqa_color": "what color is the {shape} ?",
    "vqa_color_at": "what color is the {shape} in the {row} {column} ?",
    "vqa_count": "how many {shapes} are there ?",
    "vqa_exists": "is there a {colour} {shape} ?",
    "yes": "yes",
    "no": "no",
    # reasoning
    "compare_prompt": "are there more {shapes} or more {shapes_b} ? explain .",
    "count_one": "one {shape}",
    "count_many": "{n} {shapes}",
    "count_none": "no {shapes}",
    "compare_facts": "there are {count_a} and {count_b} .",
    "compare_facts_one": "there is {count_a} and {count_b} .",
    "more": "{n} is more than {m} . so there are more {shapes} .",
    "less": "{n} is less than {m} . so there are more {shapes_b} .",
    "equal": "{n} is equal to {m} . so there are as many {shapes} as {shapes_b} .",
    "colour_prompt": "how many objects are {colour} ? think step by step .",
    "colour_fact": "the {size} {shape} in the {row} {column} is {colour} .",
    "colour_one": "so one object is {colour} .",
    "colour_many": "so {n} objects are {colour} .",
    "colour_none": "so no objects are {colour} .",
    "total_prompt": "how many objects are there in total ? think step by step .",
    "total_facts": "there are {count_a} , {count_b} and {count_c} .",
    "total_facts_one": "there is {count_a} , {count_b} and {count_c} .",
    "total_sum": "{n} plus {m} plus {k} is {total} .",
    "total_one": "so there is one object .",
    "total_many": "so there are {total} objects .",
}

SLOT_WORDS: dict[str, tuple[str, ...]] = {
    "shape": SHAPES, "shapes": tuple(PLURALS[s] for s in SHAPES), "shapes_b": tuple(PLURALS[s] for s in SHAPES),
    "colour": COLOURS, "size": SIZES, "row": ROWS, "column": COLUMNS,
    "n": NUMBERS, "m": NUMBERS, "k": NUMBERS, "total": NUMBERS,
}


def _t(name: str, **slots: str) -> str:
    return TEMPLATES[name].format(**slots)


def _number(n: int) -> str:
    if not 0 <= n < len(NUMBERS):
        raise ValueError(f"no number word for {n}")
    return NUMBERS[n]


def _object(o: SceneObject) -> str:
    return _t("object", size=o.size, colour=o.colour, shape=o.shape, row=o.row, column=o.column)


def _join(parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    return f" {_t('list_sep')} ".join(parts[:-1]) + f" {_t('list_last')} " + parts[-1]


def _count(n: int, shape: str) -> str:
    if n == 0:
        return _t("count_none", shapes=PLURALS[shape])
    if n == 1:
        return _t("count_one", shape=shape)
    return _t("count_many", n=_number(n), shapes=PLURALS[shape])


def caption(scene: Scene, rng: random.Random) -> tuple[str, str]:
    """A COCO-like one-sentence description listing every object (colour, size, shape, position)."""
    prompt = _t(f"caption_prompt_{rng.randrange(3)}")
    objects = _join([_object(o) for o in scene.objects])
    if len(scene.objects) == 1:
        return prompt, _t("caption_one", objects=objects)
    return prompt, _t("caption_many", n=_number(len(scene.objects)), objects=objects)


def vqa(scene: Scene, rng: random.Random, kind: str | None = None) -> tuple[str, str]:
    """A short-answer question: ``color`` (→ a colour), ``count`` (→ a number), ``exists`` (→ yes/no).

    The question depends only on shapes/positions and ``rng``, so the answer is the image-dependent part.
    """
    kind = kind if kind is not None else rng.choice(VQA_KINDS)
    if kind == "color":
        if not scene.objects:
            raise ValueError("a color question needs at least one object")
        o = scene.objects[rng.randrange(len(scene.objects))]
        if scene.count(shape=o.shape) == 1:
            return _t("vqa_color", shape=o.shape), o.colour
        return _t("vqa_color_at", shape=o.shape, row=o.row, column=o.column), o.colour
    if kind == "count":
        shape = rng.choice(SHAPES)
        return _t("vqa_count", shapes=PLURALS[shape]), _number(scene.count(shape=shape))
    if kind == "exists":
        if scene.objects and rng.random() < 0.5:  # half the time ask about an object that is there
            o = scene.objects[rng.randrange(len(scene.objects))]
            colour, shape = o.colour, o.shape
        else:
            colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
        answer = _t("yes") if scene.count(shape=shape, colour=colour) else _t("no")
        return _t("vqa_exists", colour=colour, shape=shape), answer
    raise ValueError(f"unknown vqa kind {kind!r}; expected one of {VQA_KINDS}")


def reasoning(scene: Scene, rng: random.Random, kind: str | None = None) -> tuple[str, str]:
    """A few sentences of step-by-step reasoning: ``compare`` two shape counts, ``colour_count``, ``total``."""
    kind = kind if kind is not None else rng.choice(REASONING_KINDS)
    if kind == "compare":
        a, b = rng.sample(SHAPES, 2)
        na, nb = scene.count(shape=a), scene.count(shape=b)
        prompt = _t("compare_prompt", shapes=PLURALS[a], shapes_b=PLURALS[b])
        facts = _t("compare_facts_one" if na == 1 else "compare_facts",
                   count_a=_count(na, a), count_b=_count(nb, b))
        verdict = "more" if na > nb else "less" if na < nb else "equal"
        return prompt, facts + " " + _t(verdict, n=_number(na), m=_number(nb),
                                        shapes=PLURALS[a], shapes_b=PLURALS[b])
    if kind == "colour_count":
        colour = rng.choice(COLOURS)
        steps = [_t("colour_fact", size=o.size, shape=o.shape, row=o.row, column=o.column, colour=o.colour)
                 for o in scene.objects]
        n = scene.count(colour=colour)
        end = _t("colour_none" if n == 0 else "colour_one" if n == 1 else "colour_many",
                 n=_number(n), colour=colour)
        return _t("colour_prompt", colour=colour), " ".join(steps + [end])
    if kind == "total":
        counts = [scene.count(shape=s) for s in SHAPES]
        total = sum(counts)
        slots = {f"count_{x}": _count(c, s) for x, c, s in zip("abc", counts, SHAPES)}
        facts = _t("total_facts_one" if counts[0] == 1 else "total_facts", **slots)
        summed = _t("total_sum", n=_number(counts[0]), m=_number(counts[1]), k=_number(counts[2]),
                    total=_number(total))
        end = _t("total_one") if total == 1 else _t("total_many", total=_number(total))
        return _t("total_prompt"), f"{facts} {summed} {end}"
    raise ValueError(f"unknown reasoning kind {kind!r}; expected one of {REASONING_KINDS}")


TASK_MAKERS = {"caption": caption, "vqa": vqa, "reasoning": reasoning}


def make_example(scene: Scene, task: str, rng: random.Random, image_size: int = 64) -> dict[str, Any]:
    """``{"image": PIL image, "prompt": str, "answer": str, "task": task}`` for one of ``TASKS``."""
    if task not in TASK_MAKERS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    prompt, answer = TASK_MAKERS[task](scene, rng)
    return {"image": render(scene, size=image_size), "prompt": prompt, "answer": answer, "task": task}
