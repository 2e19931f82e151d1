"""The shipped world at batch 8 (32 prompts, 4 calls), one draft: after `warm` passes of Auto, the answers' book's
predicted tokens per round of each chain over batch calls (the longest row's tokens over the most rounds a row of the
call takes) against what each fixed chain realises over the same calls, and each fixed chain's seconds per pass."""
import sys, time, statistics as st
import hf_specmm
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS

name, warm, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world = load_world_models(); target = world.target; hf_specmm.enable(target)
examples = [e for task in eval_examples(11).values() for e in task][:32]
inputs = [encode_prompts(world.processor, examples[i:i + 8], "raw", target.device) for i in range(0, 32, 8)]
gen = {"max_new_tokens": MAX_ANSWER_TOKENS, "do_sample": False}
d = world.drafts[name]; auto = hf_specmm.Auto(d, max_tokens=64)
for _ in range(warm):
    for x in inputs: target.generate(**x, **gen, assistant_model=auto)
book = auto.acceptance(target).answers
predicted = book.chain_tokens(batch=True)
realised, seconds = {}, {g: [] for g in range(1, 9)}
for p in range(passes):
    for g in range(1, 9):
        s = time.perf_counter(); toks = rnds = 0
        for x in inputs:
            target.generate(**x, **gen, assistant_model=d, num_assistant_tokens=g)
            per_round = hf_specmm.last_stats(target).tokens_per_round
            rows = len(per_round[0]) if per_round else 0
            toks += max(sum(r[i] for r in per_round) for i in range(rows))
            rnds += max(sum(1 for r in per_round if r[i] > 0) for i in range(rows))
        seconds[g].append(time.perf_counter() - s); realised[g] = toks / rnds
print("chain | book's tokens/round | realised | ratio | seconds/pass (median)")
for g in range(1, 9):
    print(f"{g} | {predicted[g - 1]:.3f} | {realised[g]:.3f} | {predicted[g - 1] / realised[g]:.3f} | {st.median(seconds[g]):.4f}")
