"""Streaming (a BaseStreamer that records put() calls, transformers.TextStreamer) and the
``image-text-to-text`` pipeline with a batch of images + prompts and an assistant_model."""

from __future__ import annotations

import pytest
import torch
from transformers import TextStreamer, pipeline
from transformers.generation.streamers import BaseStreamer

import hf_specmm
from hf_specmm import testing
from hf_specmm.errors import SpecMMError
from conftest import PROMPTS, batch_inputs

NEW = 20


class RecordingStreamer(BaseStreamer):
    """Records every put() and, through ``clock``, how many target forwards had run when it came."""

    def __init__(self, clock: dict | None = None):
        self.puts: list[torch.Tensor] = []
        self.times: list[int] = []
        self.ended = 0
        self.clock = clock

    def put(self, value):
        assert self.ended == 0, "put() after end()"
        self.puts.append(value.detach().clone())
        self.times.append(self.clock["n"] if self.clock is not None else 0)

    def end(self):
        self.ended += 1


def _forward_clock(model):
    clock = {"n": 0}

    def hook(module, args):
        clock["n"] += 1

    return clock, model.register_forward_pre_hook(hook)


def _streamed_new_tokens(streamer: RecordingStreamer) -> torch.Tensor:
    chunks = []
    for value in streamer.puts[1:]:
        assert value.dim() in (1, 2) and (value.dim() == 1 or value.shape[0] == 1), value.shape
        chunks.append(value.reshape(-1))
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.long)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("with_images", (False, True))
def test_recorded_stream_equals_generated_tokens(family, with_images):
    model = hf_specmm.enable(testing.tiny_target(family, eos_bias=-30.0))
    d = testing.text_draft_from_target(model)
    inputs = batch_inputs(family, 1, with_images=with_images)
    prompt = inputs["input_ids"]
    plain_streamer = RecordingStreamer()
    plain = type(model).generate(model, **inputs, max_new_tokens=NEW, do_sample=False, streamer=plain_streamer)

    clock, handle = _forward_clock(model)
    streamer = RecordingStreamer(clock)
    try:
        out = model.generate(**inputs, assistant_model=d, max_new_tokens=NEW, do_sample=False,
                             num_assistant_tokens=4, streamer=streamer)
    finally:
        handle.remove()
    assert torch.equal(out, plain)
    new = out[0, prompt.shape[1]:]
    assert new.numel() == NEW
    assert torch.equal(streamer.puts[0].reshape(prompt.shape), prompt), "first put() must be the prompt"
    assert torch.equal(_streamed_new_tokens(streamer), new)
    assert torch.equal(_streamed_new_tokens(streamer), _streamed_new_tokens(plain_streamer))
    assert streamer.ended == 1
    assert all(p.numel() > 0 for p in streamer.puts), "empty put()"
    # streamed while generating: the prompt before any forward, each chunk after a new target forward
    assert streamer.times[0] == 0
    assert all(a < b for a, b in zip(streamer.times[1:], streamer.times[2:])), streamer.times
    assert len(streamer.puts) - 1 < NEW, "no put() carried more than one token: speculation did not happen"
    assert len(streamer.puts) - 1 == hf_specmm.last_stats(model).target_forwards


def test_recorded_stream_with_eos_and_sampling():
    """A row that stops at EOS streams exactly its tokens up to and including EOS; same with sampling."""
    family = "llava"
    model = hf_specmm.enable(testing.tiny_target(family, seed=3, eos_bias=4.0))
    d = testing.text_draft_from_target(model)
    inputs = batch_inputs(family, 1)
    eos = model.generation_config.eos_token_id
    saw_eos = False
    for do_sample in (False, True):
        streamer = RecordingStreamer()
        torch.manual_seed(7)
        out = model.generate(**inputs, assistant_model=d, max_new_tokens=30, do_sample=do_sample, streamer=streamer)
        new = out[0, inputs["input_ids"].shape[1]:]
        streamed = _streamed_new_tokens(streamer)
        assert torch.equal(streamed, new)
        if (new == eos).any():
            saw_eos = True
            assert int((new == eos).nonzero()[0]) == new.numel() - 1, "tokens streamed after EOS"
        assert streamer.ended == 1
    assert saw_eos, "fixture: eos_bias=4.0 should make the row stop at EOS"


@pytest.mark.parametrize("skip_prompt", (True, False))
def test_text_streamer_prints_generated_text(capsys, skip_prompt):
    family = "llava"
    model = testing.tiny_target(family)
    tok = testing.tiny_processor(family).tokenizer
    inputs = batch_inputs(family, 1)
    capsys.readouterr()
    plain = model.generate(**inputs, max_new_tokens=NEW, do_sample=False,
                           streamer=TextStreamer(tok, skip_prompt=skip_prompt))
    stock_printed = capsys.readouterr().out

    hf_specmm.enable(model)
    out = model.generate(**inputs, assistant_model=testing.text_draft_from_target(model), max_new_tokens=NEW,
                         do_sample=False, streamer=TextStreamer(tok, skip_prompt=skip_prompt))
    printed = capsys.readouterr().out
    assert torch.equal(out, plain)
    new_text = tok.decode(out[0, inputs["input_ids"].shape[1]:])
    assert new_text.strip() and new_text.strip() in printed
    assert printed == stock_printed
    if skip_prompt:
        assert printed.strip() == new_text.strip()
    else:
        assert printed.strip() == tok.decode(out[0]).strip()


# ---- pipelines ----------------------------------------------------------------------------------------------

def _images(family):
    sizes = [(32, 32)] * 3 if family == "llava_next" else [(32, 32), (64, 32), (32, 64)]
    return [testing.tiny_image(10 + i, s) for i, s in enumerate(sizes)]


def _pipe(family):
    model = testing.tiny_target(family)
    return pipeline("image-text-to-text", model=model, processor=testing.tiny_processor(family))


def _assert_stock_rejects_batch3(pipe, call):
    """Stock transformers' assisted generation only takes batch size 1: this is why hf_specmm exists."""
    assert not hf_specmm.is_enabled(pipe.model)
    same_vocab = testing.text_draft_from_target(pipe.model)
    try:
        call({"assistant_model": same_vocab})
    except ValueError as e:
        assert not isinstance(e, SpecMMError)
        assert "batch" in str(e), e
    # else: this transformers version accepts batched assisted generation; nothing to document


def _texts(result):
    return [r["generated_text"] if isinstance(r, dict) else [x["generated_text"] for x in r] for r in result]


@pytest.mark.parametrize("family", ("llava", "llava_next"))
def test_pipeline_images_and_prompts_batch(family):
    pipe = _pipe(family)
    images, texts = _images(family), [f"<image> {p}" for p in PROMPTS]

    def call(extra):
        kw = {"max_new_tokens": 12, "do_sample": False, **extra}
        return pipe(images=images, text=texts, batch_size=3, generate_kwargs=kw)

    plain = call({})
    assert len(plain) == 3 and len({r["generated_text"] for r in plain}) == 3
    _assert_stock_rejects_batch3(pipe, call)
    assert hf_specmm.enable(pipe.model) is pipe.model
    for d in (testing.text_draft_from_target(pipe.model),
              testing.random_text_draft(pipe.model, vocab_size=pipe.model.config.text_config.vocab_size - 4)):
        out = call({"assistant_model": d})
        assert _texts(out) == _texts(plain)
        assert out == plain
        stats = hf_specmm.last_stats(pipe.model)
        assert stats.batch_size == 3, "the pipeline should have made ONE generate call with the three rows"


@pytest.mark.parametrize("family", ("llava", "llava_next"))
def test_pipeline_chat_messages_batch(family):
    """Chat input: the pipeline processes each chat on its own and pads them into batches of 3 itself."""
    pipe = _pipe(family)
    chats = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": p}]}]
             for img, p in zip(_images(family), PROMPTS)]

    def call(extra):
        kw = {"max_new_tokens": 12, "do_sample": False, **extra}
        return pipe(text=chats, batch_size=3, generate_kwargs=kw)

    plain = call({})
    assert len(plain) == 3
    replies = [r[0]["generated_text"][-1]["content"] if isinstance(r, list) else r["generated_text"][-1]["content"]
               for r in plain]
    assert all(replies) and len(set(replies)) > 1, replies
    _assert_stock_rejects_batch3(pipe, call)
    hf_specmm.enable(pipe.model)
    out = call({"assistant_model": testing.text_draft_from_target(pipe.model)})
    assert out == plain
    assert hf_specmm.last_stats(pipe.model).batch_size == 3
