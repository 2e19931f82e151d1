"""A speculative call on CUDA runs scaled-dot-product attention without PyTorch's cuDNN backend (it builds a graph
per new attention shape, and rounds meet new shapes at nearly every round): the flag is cleared for the call's
length, restored after the last overlapping call, and left alone off CUDA or where the caller left cuDNN the only
fused kernel. These tests run on the CPU: the flags are process settings that CPU builds of torch hold too."""

from __future__ import annotations

import threading

import pytest
import torch

import hf_specmm
from hf_specmm import api, testing
from hf_specmm.devices import without_cudnn_attention

from conftest import PROMPTS  # noqa: F401  (conftest's settings: one torch thread, offline)

CUDA = torch.device("cuda")
cuda = torch.backends.cuda
pytestmark = pytest.mark.skipif(not hasattr(cuda, "cudnn_sdp_enabled"), reason="torch without cuDNN attention")
FLAGS = ("cudnn", "flash", "mem_efficient", "math")


def _flags() -> dict[str, bool]:
    return {name: getattr(cuda, f"{name}_sdp_enabled")() for name in FLAGS}


@pytest.fixture(autouse=True)
def restore_flags():
    before = _flags()
    for name in FLAGS:
        getattr(cuda, f"enable_{name}_sdp")(True)
    yield
    for name, on in before.items():
        getattr(cuda, f"enable_{name}_sdp")(on)


def test_cleared_for_the_call_and_restored_after_nested_calls():
    with without_cudnn_attention(CUDA):
        assert _flags() == {"cudnn": False, "flash": True, "mem_efficient": True, "math": True}
        with without_cudnn_attention(CUDA):
            assert not cuda.cudnn_sdp_enabled()
        assert not cuda.cudnn_sdp_enabled(), "an inner call's end restored the flag under a running call"
    assert cuda.cudnn_sdp_enabled()


def test_restored_when_the_call_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with without_cudnn_attention(CUDA):
            raise RuntimeError("boom")
    assert cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize("case", ["cpu", "cudnn already off", "cudnn the only fused kernel", "no backend but cudnn"])
def test_left_alone(case):
    device = torch.device("cpu") if case == "cpu" else CUDA
    if case == "cudnn already off":
        cuda.enable_cudnn_sdp(False)
    if case in ("cudnn the only fused kernel", "no backend but cudnn"):  # the caller chose cuDNN over the math one
        for name in ("flash", "mem_efficient") + (("math",) if case == "no backend but cudnn" else ()):
            getattr(cuda, f"enable_{name}_sdp")(False)
    before = _flags()
    with without_cudnn_attention(device):
        assert _flags() == before
    assert _flags() == before


def test_overlapping_calls_on_threads_restore_after_the_last():
    a_in, b_done, seen = threading.Event(), threading.Event(), {}

    def call_a():
        with without_cudnn_attention(CUDA):
            a_in.set()
            b_done.wait(10)
            seen["a, after b ended"] = cuda.cudnn_sdp_enabled()

    def call_b():
        a_in.wait(10)
        with without_cudnn_attention(CUDA):
            seen["b"] = cuda.cudnn_sdp_enabled()
        b_done.set()

    threads = [threading.Thread(target=f) for f in (call_a, call_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"b": False, "a, after b ended": False}
    assert cuda.cudnn_sdp_enabled()


def test_generate_on_cuda_runs_its_forwards_without_cudnn(monkeypatch):
    """Through ``generate``: every target forward of a speculative call (prefill and rounds) sees the flag cleared;
    stock generate without a draft sees it as the caller set it; it is restored after the call."""
    model = testing.tiny_target("llava")
    draft = testing.text_draft_from_target(model)
    inputs = testing.make_inputs("llava", testing.tiny_processor("llava"), ["describe the image"], [testing.tiny_image(0)])
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda *_: seen.append(cuda.cudnn_sdp_enabled()))
    monkeypatch.setattr(api, "execution_device", lambda m: CUDA)  # the flag's rule, on a CPU model
    hf_specmm.enable(model)
    out = model.generate(**inputs, assistant_model=draft, max_new_tokens=8, do_sample=False)
    assert len(seen) >= 2 and not any(seen), seen
    assert cuda.cudnn_sdp_enabled()
    seen.clear()
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert seen and all(seen)
    assert torch.equal(out, plain)
