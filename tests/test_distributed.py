"""``hf-specmm train`` on 2 CPU processes (gloo), started by ``accelerate launch`` and by ``torchrun`` exactly as a
user would: the same weights as one process at the same global batch (2 × batch b == 1 × batch 2b, gradient
accumulation and both adapter stages included, a process whose share has no image line included), the shared
answer cache written once per answer, checkpoints resumable on another number of processes in both directions,
the held-out τ of the whole held-out set; and training on a target dispatched by accelerate (disk/CPU offload)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.train import TrainConfig, TrainingInputError, train_draft
from test_dispatch import DEVICE_MAP

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 4  # per micro-batch; × grad_accum 2 = 8 lines per optimizer step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher: str, flags: list[str]) -> None:
    """``hf-specmm train FLAGS`` on 2 CPU processes, through the launcher's own command line."""
    if launcher == "accelerate":
        # --multi_gpu: accelerate's multi-process launcher (torchrun underneath); `--cpu` would start ONE process.
        # The processes run on the CPU (gloo) because hf-specmm train gets --device cpu.
        cmd = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    else:
        cmd = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, *cmd, "-m", "hf_specmm.cli", "train", *flags], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    testing.tiny_target("llava", eos_bias=-30.0).save_pretrained(root / "target")
    testing.tiny_processor("llava").save_pretrained(root / "target")
    (root / "imgs").mkdir()
    vocab = testing.tiny_processor("llava").tokenizer.get_vocab()
    words = sorted((w for w in vocab if not w.startswith("<")), key=vocab.get)
    rng, lines = random.Random(0), []
    for i in range(20):
        line = {"image": None, "prompt": " ".join(rng.choice(words) for _ in range(4))}
        if i % 2:
            testing.tiny_image(i).save(root / "imgs" / f"{i}.png")
            line["image"] = f"{i}.png"
        lines.append(line)
    lines.append(dict(lines[1]))  # a repeated line: one answer, generated once
    (root / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


# one config, spelled as TrainConfig fields and as the CLI flags a user types
COMMON = dict(draft_config="tiny", draft_kind="image_adapter", steps=2, stage2_steps=3, grad_accum=2, lr=3e-3,
              stage2_lm_lr=1e-3, max_new_tokens=6, eval_fraction=0.2, eval_gamma=3, eval_batch_size=2,
              checkpoint_every=3, keep_checkpoints=5, eval_before=False, progress=False)
FLAGS = ["--draft-config", "tiny", "--draft-kind", "image_adapter", "--steps", "2", "--stage2-steps", "3",
         "--grad-accum", "2", "--lr", "3e-3", "--stage2-lm-lr", "1e-3", "--max-new-tokens", "6", "--eval-fraction",
         "0.2", "--gamma", "3", "--eval-batch-size", "2", "--checkpoint-every", "3", "--keep-checkpoints", "5",
         "--no-eval-before", "--no-progress", "--device", "cpu"]


def one_process(root: Path, out: str, cache: str, **kw) -> hf_specmm.train.TrainResult:
    return train_draft(TrainConfig(target=str(root / "target"), data=str(root / "data.jsonl"),
                                   images=str(root / "imgs"), output_dir=str(root / out), batch_size=GLOBAL_BATCH,
                                   response_cache=str(root / cache), **COMMON, **kw))


def two_processes(root: Path, launcher: str, out: str, cache: str, *extra: str) -> Path:
    launch(launcher, ["--target", str(root / "target"), "--data", str(root / "data.jsonl"), "--images",
                      str(root / "imgs"), "--output-dir", str(root / out), "--batch-size", str(GLOBAL_BATCH // 2),
                      "--response-cache", str(root / cache), *FLAGS, *extra])
    return root / out


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, what: str) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], atol=1e-5, rtol=1e-4, msg=f"{what}: {name}")


def read_cache(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_train_the_same_draft_as_one_and_resume_across_process_counts(setup):
    root = setup
    single = one_process(root, "single", "answers-1.jsonl")  # 1 process × batch 4: the reference
    # 2 processes × batch 2 (accelerate launch), answering the prompts in parallel into a fresh cache
    two = two_processes(root, "accelerate", "two", "answers-2.jsonl")
    assert_same_weights(single.draft, hf_specmm.load_draft(two / "draft"), "2 processes vs 1")
    summary = json.loads((two / "train_summary.json").read_text())
    assert summary["processes"] == 2 and summary["global_step"] == single.global_step == 5
    assert summary["train_tokens"] == single.train_tokens  # the same lines were trained on
    # held-out τ: every held-out prompt counted once, summed over the two processes' batches
    for key in ("prompts", "generated_tokens", "target_forwards", "drafted_tokens"):
        assert summary["tau_after"][key] == single.tau_after[key], key
    # the shared cache: each answer once (the repeated line too), the same answers as one process wrote
    one_lines, two_lines = read_cache(root / "answers-1.jsonl"), read_cache(root / "answers-2.jsonl")
    assert len({line["key"] for line in two_lines}) == len(two_lines) == summary["responses_generated"] == 16
    assert sorted(map(json.dumps, one_lines)) == sorted(map(json.dumps, two_lines))
    # written once: the checkpoints of steps 3 and 5 (every 3, end of each stage), nothing half-written
    names = sorted(p.name for p in (two / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003", "step-000005"], names

    # resume across process counts, both ways, mid stage 2 (step 3 of 5): the same final weights
    back = one_process(root, "from-two", "answers-2.jsonl", resume=str(two / "checkpoints" / "step-000003"))
    assert back.completed and back.responses_generated == 0 and len(back.losses) == 2
    assert_same_weights(single.draft, back.draft, "2 processes, resumed on 1")
    forth = two_processes(root, "torchrun", "from-one", "answers-1.jsonl", "--resume",
                          str(root / "single" / "checkpoints" / "step-000003"))
    assert_same_weights(single.draft, hf_specmm.load_draft(forth / "draft"), "1 process, resumed on 2 (torchrun)")
    assert json.loads((forth / "train_summary.json").read_text())["responses_generated"] == 0

    # the target dispatched by accelerate (layers offloaded to disk and CPU, --target-device-map): same draft
    dispatched = one_process(root, "dispatched", "answers-1.jsonl", target_device_map=DEVICE_MAP)
    assert dispatched.responses_generated == 0 and (root / "dispatched" / "target-offload").is_dir()
    assert_same_weights(single.draft, dispatched.draft, "dispatched target")
    assert dispatched.tau_after == single.tau_after

    # another global batch is another trajectory: refused, naming it, before any work
    with pytest.raises(TrainingInputError, match=r"global_batch_size: 4 -> 2"):
        train_draft(TrainConfig(target=str(root / "target"), data=str(root / "data.jsonl"), images=str(root / "imgs"),
                                output_dir=str(root / "other"), batch_size=GLOBAL_BATCH // 2,
                                response_cache=str(root / "answers-1.jsonl"),
                                resume=str(root / "single" / "checkpoints" / "step-000003"), **COMMON))


def test_fsdp_or_deepspeed_launch_and_bad_device_maps_are_refused_before_any_work(tmp_path, capsys):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from hf_specmm import cli
    from hf_specmm.train.distributed import Processes

    procs = Processes("cpu")
    procs.check_supported()  # one process: fine
    for kind in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        procs.accelerator = SimpleNamespace(distributed_type=kind)  # as a launch with such a config makes it
        with pytest.raises(TrainingInputError, match=f"{kind.value}.*--target-device-map auto"):
            procs.check_supported()
    with pytest.raises(SystemExit) as exc:  # one line, exit code 2, before any file or model is read
        cli.main(["train", "--target", "t", "--data", "d", "--output-dir", str(tmp_path), "--draft-config", "tiny",
                  "--target-device-map", "everywhere"])
    assert exc.value.code == 2 and "--target-device-map" in capsys.readouterr().err
    with pytest.raises(TrainingInputError, match="target_device_map='everywhere'"):
        TrainConfig(target="t", data="d", output_dir=str(tmp_path), draft_config="tiny",
                    target_device_map="everywhere").validate()
