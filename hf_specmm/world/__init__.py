"""Miniature world: seeded synthetic image-text data (shapes on a grid) for training and testing drafts.

Example::

    >>> import random
    >>> from hf_specmm.world import sample_scene, make_example
    >>> ex = make_example(sample_scene(random.Random(0)), "vqa", random.Random(0))
    >>> sorted(ex)
    ['answer', 'image', 'prompt', 'task']
"""

from .dataset import generate_world, world_records
from .scenes import Scene, SceneObject, png_bytes, render, sample_scene
from .tasks import TASKS, caption, make_example, reasoning, vqa
from .tokenizer import build_world_tokenizer, world_vocabulary

__all__ = ["Scene", "SceneObject", "TASKS", "build_world_tokenizer", "caption", "generate_world",
           "make_example", "png_bytes", "reasoning", "render", "sample_scene", "vqa", "world_records",
           "world_vocabulary"]
