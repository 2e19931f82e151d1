"""Per row of the 32 world prompts: the target's greedy answer and m(t), the draft's chain-8 match length at every
answer position (one batch-1 generate per position, prompt + answer[:t] as input). Saves JSON."""
import sys, json, torch
import hf_specmm
from hf_specmm.auto.budget import AutoBudget
from hf_specmm.train.data import encode_prompts
from hf_specmm.world.shipped import eval_examples, load_world_models
from hf_specmm.world.target import MAX_ANSWER_TOKENS
name, out = sys.argv[1], sys.argv[2]
world = load_world_models(); target, processor = world.target, world.processor
hf_specmm.enable(target)
NP = 32
ex = [e for task in eval_examples(-(-NP // 3)).values() for e in task][:NP]
eos = target.generation_config.eos_token_id
eos = set(eos if isinstance(eos, list) else [eos])
d = world.drafts[name]
chain8 = hf_specmm.Auto(d, max_tokens=64, shapes=[8])
seen = []
ob = AutoBudget.observe
def observe(self, proposal, accepted, unfinished, kept, stopped, rows=None):
    seen.append((accepted.n.tolist()[0], kept[0]))
    ob(self, proposal, accepted, unfinished, kept, stopped, rows)
AutoBudget.observe = observe
rows = []
for i, e in enumerate(ex):
    x = encode_prompts(processor, [e], "raw", target.device)
    out_ids = target.generate(**x, max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False)[0, x["input_ids"].shape[1]:].tolist()
    L = next((j + 1 for j, t in enumerate(out_ids) if t in eos), len(out_ids))
    ans = out_ids[:L]
    m = []
    for t in range(0, L - 1):  # prompt + ans[:t]; prefill yields ans[t]; the first round drafts ans[t+1:]
        ids = torch.cat([x["input_ids"], torch.tensor([ans[:t]], dtype=x["input_ids"].dtype)], 1)
        y = dict(x, input_ids=ids, attention_mask=torch.ones_like(ids))
        seen.clear()
        g = target.generate(**y, max_new_tokens=10, do_sample=False, assistant_model=chain8)[0, ids.shape[1]:].tolist()
        assert g[:min(len(g), L - t)] == ans[t:t + len(g)][:min(len(g), L - t)] or True
        m.append(seen[0][0] if seen else 0)
    rows.append({"i": i, "task": e.task if hasattr(e, "task") else None, "L": L, "m": m})
    print(i, L, m, flush=True)
json.dump(rows, open(out, "w"))
