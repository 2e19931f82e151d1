"""Training across processes: ``hf-specmm train`` started by ``accelerate launch`` or ``torchrun`` (one process
per GPU, or ``--cpu`` processes on the gloo backend). accelerate's ``Accelerator`` sets up the process group
from the launcher's environment and gives the collectives; a plain ``python`` run is one process and every
method here is then a no-op (the single-process trainer is unchanged, bit for bit).

The split is the data-parallel one, exact by construction:

- every process draws the same global batch (the sampler is deterministic) and trains its own contiguous
  slice of each micro-batch, so ``--batch-size b`` on ``n`` processes trains the same examples in the same
  order as ``--batch-size n·b`` on one;
- each process divides its summed loss by the answer tokens of the WHOLE optimizer step (known to every
  process: it drew the whole batch), and gradients are summed over processes: exactly the single-process
  gradient, so clipping, AdamW and the scheduler see the same numbers and the drafts stay identical;
- the frozen target is replicated (one copy per process) and only ever runs forward.

Why gradients are summed here rather than by wrapping the draft in ``DistributedDataParallel``: the training
views run parts of the draft (the adapter draft's LM in stage 1, a VLM draft's language model with the images),
not the wrapper's ``forward``, and DDP only syncs gradients of forwards that went through the wrapper. One
flat all-reduce per optimizer step (the draft is small) costs what DDP's would.

    >>> procs = Processes("cpu")
    >>> procs.world, procs.rank, procs.is_main
    (1, 0, True)
    >>> procs.local_slice(list(range(8)), 0, 8)
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class Processes:
    """The processes of one training run (``accelerate.Accelerator`` underneath), as the trainer uses them."""

    def __init__(self, device: str):
        from accelerate import Accelerator

        # launched with --device cpu: gloo processes even on a machine with GPUs; otherwise one GPU per process.
        # One process: accelerate's device is not used (so no clash with an Accelerator made earlier in it)
        launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.accelerator = Accelerator(cpu=launched and torch.device(device).type == "cpu")
        self.world = self.accelerator.num_processes
        self.rank = self.accelerator.process_index
        self.is_main = self.accelerator.is_main_process
        # one process: the device asked for (e.g. cuda:1); several: the one the launcher gave this process
        self.device = torch.device(device) if self.world == 1 else self.accelerator.device

    def check_supported(self) -> None:
        """FSDP / DeepSpeed launch configs shard what ``prepare`` is given; this trainer prepares nothing (see
        the module docstring) and would silently replicate the target: refuse before any work."""
        kind = str(self.accelerator.distributed_type).split(".")[-1]
        if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
            from .config import TrainingInputError

            raise TrainingInputError(
                f"hf-specmm train was launched with a {kind} accelerate config; it trains data-parallel (the draft "
                "is small, the frozen target only runs forward). For a target larger than one GPU use "
                "--target-device-map auto: each process spreads the target over its share of the GPUs "
                "(launch with a MULTI_GPU config and fewer processes than GPUs).")

    def gpu_share(self) -> list[int]:
        """This process's GPUs for a target spread over several: the machine's visible GPUs split evenly
        among its processes (e.g. 8 GPUs, 2 processes: 0-3 and 4-7)."""
        count = torch.cuda.device_count()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        per = count // max(local_world, 1)
        if per < 1:
            from .config import TrainingInputError

            raise TrainingInputError(f"{local_world} processes on this machine but {count} GPUs: "
                                     "--target-device-map auto needs at least one GPU per process")
        local = self.accelerator.local_process_index
        return list(range(local * per, (local + 1) * per))

    def target_placement(self, device_map: str | dict | None) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments that place the target (``{}``: whole on :attr:`device`). With
        ``"auto"`` on several GPU processes, each process gets its share of the GPUs, and its draft and
        collectives move to the share's first GPU."""
        if device_map is None:
            return {}
        if device_map != "auto" or self.world == 1 or self.device.type != "cuda":
            return {"device_map": device_map}
        share = self.gpu_share()
        self.device = torch.device("cuda", share[0])
        torch.cuda.set_device(self.device)
        memory = {i: int(0.9 * torch.cuda.get_device_properties(i).total_memory) for i in share}
        return {"device_map": "auto", "max_memory": memory}

    def local_slice(self, items: list[T], start: int, size: int) -> list[T]:
        """This process's contiguous share of ``items[start : start + size]`` (``size`` = per-process × world)."""
        per = size // self.world
        return items[start + self.rank * per : start + (self.rank + 1) * per]

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def gather(self, items: list[T]) -> list[T]:
        """Every process's list, concatenated in rank order, on every process."""
        if self.world == 1:
            return list(items)
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Per-key sums over processes (metrics, τ counts); keys must be the same on every process."""
        if self.world == 1 or not values:
            return dict(values)
        keys = sorted(values)
        total = self.accelerator.reduce(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64,
                                                     device=self.device), reduction="sum")
        return dict(zip(keys, total.tolist()))

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Start every process from the main process's weights (as DDP does at construction)."""
        if self.world == 1:
            return
        from accelerate.utils import broadcast

        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                tensor.copy_(broadcast(tensor.detach().clone(), from_process=0))

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every trained parameter's gradient over processes, in one flat all-reduce. A parameter no
        process touched keeps ``grad=None`` (AdamW then skips it, as in one process); one that only some
        processes touched (e.g. the adapter when a process's share had no image) gets the sum of theirs."""
        if self.world == 1 or not params:
            return
        grads = [p.grad.reshape(-1).float() if p.grad is not None else p.new_zeros(p.numel(), dtype=torch.float32)
                 for p in params]
        touched = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
        sizes = [sum(g.numel() for g in grads), len(params)]
        flat = torch.cat([*grads, touched]).to(self.device)
        total = self.accelerator.reduce(flat, reduction="sum").to(params[0].device)
        grads, touched = total.split(sizes)
        offset = 0
        for p, used in zip(params, touched.tolist()):
            n = p.numel()
            p.grad = grads[offset : offset + n].view_as(p).to(p.dtype).clone() if used else None
            offset += n
