"""Cost of rolling back Qwen3.5's linear-attention states, per round, three ways (docs/stateful-layers.md).

  python benchmarks/linear_rollback.py [--shape tiny|9b-4layers] [--batch 1 4] [--gamma 5] [--repeats 20]

Each round verifies a block of γ + 1 tokens from the same cache, then every row keeps ``keep`` of them:

- ``forward``: the verification forward alone (no rollback: the floor);
- ``A snapshot+replay`` (hf_specmm): the forward with the capture hooks, then each linear layer replays each row's
  kept tokens from the snapshot with the single-step kernel (``caches/linear.py``);
- ``B replay model``: the forward, then the states put back from a snapshot and a second target forward over the
  kept tokens (exact only when every row keeps the same count: a lower bound for batch > 1);
- ``A: its replay alone``: the rollback call of A (timed inside it);
- ``C all positions``: the forward, then the states of all γ + 1 positions computed and kept (what capturing
  per-position states in the forward adds on top of it; an upper bound, the chunked kernel is not removed).

``9b-4layers``: Qwen3.5-9B's layer shapes (hidden 4096, Gated DeltaNet 16/32 heads of 128, attention 16/4 heads
of 256, MLP 12288), 3 linear-attention layers then 1 full-attention layer, 4096-row vocab (the 248,320-row head
would dominate a 4-layer model), float32 on the CPU. Medians of ``--repeats`` rounds (one warm-up round), the
strategies run round-robin.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers

from hf_specmm import _compat, testing
from hf_specmm.caches import DynamicBackend
from hf_specmm.caches.linear import LinearStates


def model_for(shape: str) -> transformers.PreTrainedModel:
    if shape == "tiny":
        return testing.tiny_target("qwen3_5")
    config = transformers.Qwen3_5TextConfig(
        vocab_size=4096, hidden_size=4096, intermediate_size=12288, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"])
    return transformers.Qwen3_5ForCausalLM(config).eval()


def interleaved_medians(strategies: dict, repeats: int) -> dict[str, float]:
    """Median ms of each strategy, run round-robin (one warm-up round each first), so a machine shared with
    other jobs slows them alike."""
    times: dict[str, list[float]] = {name: [] for name in strategies}
    for index in range(repeats + 1):
        for name, fn in strategies.items():
            start = time.perf_counter()
            fn()
            if index:
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


@torch.no_grad()
def measure(model, batch: int, gamma: int, keep: int, repeats: int) -> dict[str, float]:
    width = gamma + 1
    prompt = torch.randint(3, 90, (batch, 32))
    block = torch.randint(3, 90, (batch, width))
    counts = torch.full((batch,), keep)
    kv = DynamicBackend().new(model, batch, prompt.device)
    model(input_ids=prompt, **kv.append(None, prompt.shape[1]), **kv.forward_kwargs(), use_cache=True)
    start = kv.length
    linear: LinearStates = kv.linear
    assert linear is not None
    layers = list(_compat.gated_delta_modules(model))

    def forward() -> None:
        model(input_ids=block, **kv.append(None, width), **kv.forward_kwargs(), use_cache=True, logits_to_keep=width)

    def back() -> None:  # the next round starts from the same slots (crop only: cheap, in every strategy)
        linear._clear()
        _compat.crop_cache(kv.cache, start)
        kv.length = start

    saved = {i: tuple(s.clone() for s in _compat.linear_states(kv.cache, i)) for i in layers}

    replays: list[float] = []

    def ours() -> None:
        forward()
        tick = time.perf_counter()
        kv.rollback(start, counts)
        replays.append(time.perf_counter() - tick)
        back()

    def replay_model() -> None:
        forward()
        _compat.crop_cache(kv.cache, start)
        kv.length = start
        for i, (conv, recurrent) in saved.items():
            _compat.write_linear_states(kv.cache, i, conv, recurrent)
        model(input_ids=block[:, :keep], **kv.append(None, keep), **kv.forward_kwargs(), use_cache=True,
              logits_to_keep=1)
        back()

    def all_positions() -> None:
        forward()
        everything = torch.ones(batch, width, dtype=torch.bool)
        for conv, recurrent in linear._replay(layers, everything).values():
            kept = [recurrent.clone() for _ in range(width)]  # one state per position, kept until the rollback
            del kept
        back()

    def plain_round() -> None:  # the hooks see another cache: nothing captured
        linear.cache = None
        forward()
        linear.cache = kv.cache
        back()

    out = interleaved_medians({"forward": plain_round, "A snapshot+replay": ours, "B replay model": replay_model,
                               "C all positions": all_positions}, repeats)
    kv.close()
    out["A: its replay alone"] = 1e3 * statistics.median(replays[1:])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=("tiny", "9b-4layers"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--keep", type=int, default=3, help="tokens each row keeps of the γ + 1")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = model_for(args.shape)
    print(f"shape {args.shape}, γ {args.gamma}, keep {args.keep}, threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    for batch in args.batch:
        row = measure(copy.deepcopy(model), batch, args.gamma, args.keep, args.repeats)
        base = row["forward"]
        print(f"batch {batch}: " + ", ".join(f"{k} {v:.2f} ms ({v / base:.2f}x)" for k, v in row.items()))


if __name__ == "__main__":
    main()
