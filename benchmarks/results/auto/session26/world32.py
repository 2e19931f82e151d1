"""The shipped world's 32 held-out prompts in calls of `batch` (cost8.py, calib.py, b8cost.py): the world, its
target (hf_specmm enabled), the calls' inputs and greedy generation's options."""
import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS


def world_calls(batch: int):
    world = load_world_models()
    target = world.target
    hf_specmm.enable(target)
    examples = [e for task in eval_examples(11).values() for e in task][:32]
    inputs = [encode_prompts(world.processor, examples[i:i + batch], "raw", target.device)
              for i in range(0, 32, batch)]
    return world, target, inputs, {"max_new_tokens": MAX_ANSWER_TOKENS, "do_sample": False}
