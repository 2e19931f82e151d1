"""Where a speculative generate call's time goes, per batch size (a bench preset, controlled acceptance).

Times every target and draft forward with forward hooks (the rest is our loop: processors, stopping
criteria, rows, caches, host syncs) and counts rounds: the batch runs as many rounds as its slowest
row needs, while the per-row τ of the cost model averages over rows. Each batch size runs twice in turns:
finished rows leaving both caches (the loop's behaviour) and, for comparison, every row kept to the end.

    PYTHONPATH=. python benchmarks/loop_split.py --batch-sizes 1 4 8 \\
        > benchmarks/results/cpu-proxy-batch-1-4-8/loop_split.txt
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hf_specmm
from hf_specmm.bench import build_preset, controlled_acceptance, set_reference, synthetic_inputs
from hf_specmm.caches import DynamicBackend
from hf_specmm.drafts.registry import kind_of
from hf_specmm.targets import target_spec
from hf_specmm.vocab import VocabMap, draft_vocab_size


class Clock:
    """Wall time spent inside a module's forward (outermost calls only)."""

    def __init__(self, module: torch.nn.Module):
        self.total, self.calls, self._start = 0.0, 0, None
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *args: object) -> None:
        self._start = time.perf_counter()

    def _post(self, *args: object) -> None:
        self.total += time.perf_counter() - self._start
        self.calls += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-proxy", help="bench preset (hf-specmm bench --help lists them)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--acceptance", type=float, default=0.8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    preset = build_preset(args.preset)
    target, draft = preset.target, preset.draft
    vocab = VocabMap(target_spec(target), draft_vocab_size(draft), torch.device("cpu"))
    view = controlled_acceptance(draft, args.acceptance, seed=0, wrong_modulus=preset.text_vocab,
                                 proposable=vocab.proposable)
    target_clock, draft_clock = Clock(target), Clock(draft)
    gen = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    print(f"{args.preset}, α={args.acceptance}, γ={args.gamma}, {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads; seconds per call (median of {args.repeats})")
    for batch in args.batch_sizes:
        inputs = synthetic_inputs(preset, batch, 32, 0)
        width = inputs["input_ids"].shape[1]
        hf_specmm.disable(target)
        plain = target.generate(**inputs, **gen)
        lengths = kind_of(draft).drafter.prompt_lengths(draft, vocab, inputs["input_ids"], inputs["attention_mask"])
        samples: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for i in range(args.repeats + 1):  # the first call warms up
            for drops in (True, False):  # in turns: finished rows leave both caches, or stay to the end
                DynamicBackend.drops_rows = drops
                hf_specmm.enable(target)
                set_reference(view, plain[:, width:], lengths)
                target_clock.total = draft_clock.total = 0.0
                target_clock.calls = 0
                start = time.perf_counter()
                out = target.generate(**inputs, **gen, assistant_model=view, num_assistant_tokens=args.gamma)
                total = time.perf_counter() - start
                stats = hf_specmm.last_stats(target)
                hf_specmm.disable(target)
                DynamicBackend.drops_rows = True
                assert torch.equal(out, plain)
                if i:
                    samples[drops].append((total, target_clock.total, draft_clock.total))
        rounds = len(stats.tokens_per_round)
        per_row = [sum(1 for r in stats.tokens_per_round if r[i]) for i in range(batch)]
        for drops in (True, False):
            total, in_target, in_draft = (statistics.median(s[k] for s in samples[drops]) for k in range(3))
            loop = total - in_target - in_draft
            print(f"batch {batch}, {'finished rows leave' if drops else 'all rows to the end'}: total {total:.2f} | "
                  f"target {in_target:.2f} ({target_clock.calls} forwards, prefill included) | draft {in_draft:.2f} | "
                  f"loop {loop:.3f} ({1e3 * loop / rounds:.1f} ms/round, {100 * loop / total:.1f} %) | rounds "
                  f"{rounds}, per-row rounds mean {statistics.mean(per_row):.1f} (min {min(per_row)}, max {max(per_row)})")

if __name__ == "__main__":
    main()
