"""The set-up every script of this folder shares: the shipped world with hf_specmm enabled on its target, its first
32 evaluation prompts one by one (batch 1) and greedy generation's arguments."""
import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS


def world_batch1():
    """(world, target, the 32 prompts' inputs, generate's keyword arguments)."""
    world = load_world_models()
    target = world.target
    hf_specmm.enable(target)
    examples = [e for task in eval_examples(11).values() for e in task][:32]
    inputs = [encode_prompts(world.processor, examples[i:i + 1], "raw", target.device) for i in range(32)]
    return world, target, inputs, {"max_new_tokens": MAX_ANSWER_TOKENS, "do_sample": False}
