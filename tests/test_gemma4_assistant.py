"""The ``gemma4_assistant`` draft kind (stock's ``Gemma4AssistantForCausalLM`` / ``Gemma4UnifiedAssistantForCausalLM``
on Gemma 4 / Gemma 4 Unified targets, with and without KV-sharing layers; transformers >= 5.24): greedy parity at batch 1 and 3 (left padding, an
image-less row), chains, trees and static caches; stock's proposals round by round at batch 1; each row of a batch
proposes what it proposes alone while planted drafts are accepted in part; χ² sampling, and the constructed 50/50
case where stock is biased; refusals before any forward."""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch

import hf_specmm
from hf_specmm import IncompatibleDraftError, _compat, testing
from conftest import PROMPTS, batch_inputs, target
from test_bad_inputs import count_forwards
from test_sampling import assert_sampling_matches_plain

pytestmark = pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 assistants need transformers >= 5.24")
FAMILIES = ("gemma4", "gemma4_unified")
#: the families, and each with no KV-sharing layers (num_kv_shared_layers 0: its config still marks the last layer
#: of each type "store", the K/V an assistant reads)
VARIANTS = FAMILIES + tuple(f"{family}-unshared" for family in FAMILIES)


@functools.lru_cache(maxsize=None)
def _target(variant):
    from hf_specmm.testing.gemma4 import without_kv_sharing

    family, _, unshared = variant.partition("-")
    return without_kv_sharing(target(family)) if unshared else target(family)


def _family(variant):
    return variant.partition("-")[0]
NEW_TOKENS = 24  # past the fixtures' sliding window (16) from 13-token prompts


def assistant(model, seed=0):
    from hf_specmm.drafts.gemma4_assistant import tiny_assistant

    return tiny_assistant(model, seed=seed)


def _generate(model, inputs, draft, **kwargs):
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, do_sample=False, assistant_model=draft, **kwargs)
        return out, hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_parity(variant, batch):
    model, inputs = _target(variant), batch_inputs(_family(variant), batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    draft = assistant(model)
    for gamma in (1, 3, 7):  # the assistant has no block of its own: γ is the budget's
        out, stats = _generate(model, inputs, draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=gamma)
        assert torch.equal(out, plain), f"{variant} batch={batch} γ={gamma}:\n{out}\n!=\n{plain}"
        assert stats.drafted_tokens > 0 and max(stats.gammas) == gamma
    out, stats = _generate(model, inputs, hf_specmm.Tree(draft, top_k=2, depth=3, nodes=5), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, plain), f"{variant} batch={batch} tree:\n{out}\n!=\n{plain}"
    assert max(stats.gammas) == 3


@pytest.mark.parametrize("variant", VARIANTS)
def test_static_cache_parity(variant):
    model, inputs = _target(variant), batch_inputs(_family(variant), 3)
    hf_specmm.disable(model)
    static = dict(cache_implementation="static", max_new_tokens=NEW_TOKENS)
    plain = model.generate(**inputs, do_sample=False, **static)
    draft = assistant(model)
    out, stats = _generate(model, inputs, draft, num_assistant_tokens=3, **static)  # (trees run on dynamic caches)
    assert torch.equal(out, plain)
    assert stats.drafted_tokens > 0 and set(stats.gammas) == {3}


def _proposable(model):
    """[V] bool: the ids hf_specmm may propose for ``model`` (image ids and pads never are)."""
    from hf_specmm.targets import target_spec
    from hf_specmm.vocab import VocabMap

    vocab = model.config.get_text_config().vocab_size
    return torch.isfinite(VocabMap(target_spec(model), vocab, model.device).to_target(torch.zeros(1, vocab)))[0]


def _accepted_only(outputs, input_ids):
    """``outputs`` with the shared K/V cut to the slots the target accepted (stock keeps one more after a rejection:
    the rejected draft's, at the position of the token that replaced it)."""
    cut = copy.copy(outputs)
    keep = input_ids.shape[1] - 1
    total = outputs.shared_kv_states["full_attention"][0].shape[2]
    drop = max(total - keep, 0)  # the slots after the accepted ones (a sliding layer's cache starts later)
    cut.shared_kv_states = {name: (k[:, :, :k.shape[2] - drop], v[:, :, :v.shape[2] - drop])
                            for name, (k, v) in outputs.shared_kv_states.items()}
    return cut


def _stock_and_ours(model, draft, inputs, gamma, stock_as_loop):
    """Proposals round by round of stock's generator (batch 1) and of this kind; both outputs. ``stock_as_loop``:
    stock reads what the loop keeps (full cache layers, the accepted slots, no image or pad id proposed)."""
    from transformers import DynamicCache
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator as Stock

    from hf_specmm.drafts.gemma4_assistant import Gemma4AssistantDrafter

    proposable = _proposable(model)
    stock_blocks, ours = [], []
    real_stock, real_ours, real_forward = Stock.get_candidates, Gemma4AssistantDrafter.propose, type(draft).forward

    def stock_candidates(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches, **kwargs):
        if stock_as_loop and model_outputs is not None and not self.is_main_model_prefill:
            model_outputs = _accepted_only(model_outputs, input_ids)
        ids, logits = real_stock(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches,
                                 **kwargs)
        if logits is not None:
            stock_blocks.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    def proposable_only(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        out.logits = out.logits.masked_fill(~proposable.to(out.logits.device), torch.finfo(out.logits.dtype).min)
        return out

    def our_proposals(self, budget, select, cur):
        proposal = real_ours(self, budget, select, cur)
        ours.append(proposal.tokens[0].tolist())
        return proposal

    draft.generation_config.num_assistant_tokens = gamma
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Stock, "get_candidates", stock_candidates)
        extra = {}
        if stock_as_loop:
            patch.setattr(type(draft), "forward", proposable_only)
            extra = {_compat.CACHE_KWARG: DynamicCache()}  # full layers, as the loop keeps a sliding model's cache
        forwards = {"n": 0}
        hook = model.register_forward_pre_hook(lambda module, args: forwards.update(n=forwards["n"] + 1))
        try:
            stock = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=draft, **extra)
        finally:
            hook.remove()
        stock_tau = (stock.shape[1] - inputs["input_ids"].shape[1]) / forwards["n"]  # prefill included, as ours
        patch.setattr(Gemma4AssistantDrafter, "propose", our_proposals)
        out, stats = _generate(model, inputs, draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=gamma)
    return stock, out, stock_blocks, ours, stats, stock_tau


@pytest.mark.parametrize("variant", VARIANTS)
def test_proposals_equal_stock_at_batch_1(variant):
    """Stock's ``SinglePositionMultiTokenCandidateGenerator`` (batch 1 only) and this kind propose the same tokens
    round by round when stock reads what the loop keeps: the accepted slots of a full-layer cache (stock's own
    cut keeps the rejected draft's K/V and its sliding cache drops a slot past the window) and no image id.
    Unchanged stock proposes the same in the first round (the prompt's K/V, nothing rejected yet)."""
    model = _target(variant)
    inputs = batch_inputs(_family(variant), 1)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    for seed in (0, 1):
        draft = assistant(model, seed)
        stock, out, stock_blocks, ours, stats, as_loop_tau = _stock_and_ours(model, draft, inputs, 3,
                                                                             stock_as_loop=True)
        assert torch.equal(stock, plain) and torch.equal(out, plain)
        assert len(ours) >= 5 and ours == stock_blocks, (ours, stock_blocks)  # several rounds, rejections in them
        assert as_loop_tau == pytest.approx(stats.block_efficiency)
        stock, out, stock_blocks, ours, _, stock_tau = _stock_and_ours(model, draft, inputs, 3, stock_as_loop=False)
        assert torch.equal(stock, plain) and torch.equal(out, plain)
        print(f"{variant} assistant seed {seed}, γ 3, {NEW_TOKENS} new tokens: τ ours {stats.block_efficiency:.3f}, "
              f"stock "
              f"{stock_tau:.3f}, stock reading the accepted slots of a full-layer cache {as_loop_tau:.3f}")
        if bool(_proposable(model)[stock_blocks[0]].all()):  # stock may propose an image id: hf_specmm never does
            assert ours[0] == stock_blocks[0]


@contextlib.contextmanager
def _planting(plain, mask, record):
    """Make the drafter propose row r's plain continuation at most steps (a rule of its position, so a row's
    rounds are the same in a batch and alone) and record the assistant's own choice per (row, position, step)."""
    from hf_specmm.drafts.gemma4_assistant import Gemma4AssistantDrafter

    real_step = Gemma4AssistantDrafter._step
    prompt = mask.shape[1]
    rows = [plain[r, prompt:].tolist() for r in range(plain.shape[0])]
    rows = [plain[r, :prompt][mask[r].bool()].tolist() + rows[r] for r in range(plain.shape[0])]

    def step(self, context, tokens, hidden, depth):  # depth: the step's place in its round (0: the root)
        logits, projected = real_step(self, context, tokens, hidden, depth)
        position, j = context[2][:, 0].tolist(), depth
        if logits.shape[0] == len(rows) and logits.shape[1] == 1:  # a chain step of the whole batch
            for r, p in enumerate(position):
                record.setdefault(r, {})[(p, j, int(tokens[r, 0]))] = int(logits[r, 0].argmax())
                if (p + j) % 4 != 3 and p + j + 1 < len(rows[r]):
                    logits[r, 0, rows[r][p + j + 1]] += 1e4
        return logits, projected

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Gemma4AssistantDrafter, "_step", step)
        yield


@pytest.mark.parametrize("variant", VARIANTS)
def test_rows_propose_what_they_propose_alone_while_accepted_in_part(variant):
    """Each row's position, K/V slots and hidden state are its own: with planted drafts accepted in part (rows at
    different offsets, holes), the assistant's own choice at every (position, step, fed token) of a batch-3 row
    (left padding, an image-less row) equals the same row's alone; the outputs equal plain greedy."""
    model = _target(variant)
    inputs = batch_inputs(_family(variant), 3)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    draft = assistant(model)
    batched: dict = {}
    with _planting(plain, inputs["attention_mask"], batched):
        out, stats = _generate(model, inputs, draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=3)
    assert torch.equal(out, plain)
    assert 0.15 < stats.acceptance_rate < 0.95, stats.acceptance_rate
    for r in range(3):
        family = _family(variant)
        row_inputs = testing.make_inputs(family, testing.tiny_processor(family), [PROMPTS[r]], [_image(r)])
        alone_plain = model.generate(**row_inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        alone: dict = {}
        with _planting(alone_plain, row_inputs["attention_mask"], alone):
            out, _ = _generate(model, row_inputs, draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=3)
        assert torch.equal(out, alone_plain)
        common = set(batched[r]) & set(alone[0])
        assert len(common) >= 6
        differ = sorted((k, batched[r][k], alone[0][k]) for k in common if batched[r][k] != alone[0][k])
        assert not differ, (r, differ, len(common))


def _image(r):
    """Row ``r``'s image in ``batch_inputs`` (row 1 has none)."""
    sizes = [(32, 32), None, (64, 32)]
    return None if sizes[r] is None else testing.tiny_image(r, sizes[r])


@pytest.mark.parametrize("variant, tree", (("gemma4", False), ("gemma4", True), ("gemma4_unified-unshared", False)))
def test_sampling_matches_plain(variant, tree):
    """Drafts drawn from q (the assistant's processed distribution) and verified against that q (a tree:
    multi-candidate speculative sampling): per-position χ² against plain sampling (600 rows, temperature, top-k and
    a repetition penalty that reads the drafted history)."""
    from hf_specmm.testing.gemma4 import without_kv_sharing

    model = testing.tiny_target(_family(variant), seed=0, eos_bias=-30.0)
    model = without_kv_sharing(model) if variant.endswith("-unshared") else model
    draft = assistant(model)
    draft = hf_specmm.Tree(draft, top_k=2, depth=3, nodes=5) if tree else draft
    assert_sampling_matches_plain(model, _family(variant), draft, "gemma4_assistant")


class _TwoIds:
    """A logits processor that leaves the target (and, processed as the target's, our drafts) two equally likely
    ids: every other score -inf."""

    def __init__(self, ids):
        self.ids = list(ids)

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -float("inf"))
        out[:, self.ids] = 0.0
        return out


def fifty_fifty_share(model, draft, inputs, samples, speculative, seed=0):
    """Share of the first drafted position (the second new token) that is ``ids[0]`` when the target is split 50/50
    between two ids and the assistant's raw logits favour ``ids[0]`` (its argmax), over ``samples`` draws:
    stock's generator (batch 1 only: one call per draw) or this kind (one batch of ``samples`` rows)."""
    from transformers import LogitsProcessorList

    ids = (30, 31)
    head = draft.lm_head
    bias = torch.zeros(head.weight.shape[0])
    bias[ids[0]] = 4.0

    class Biased(torch.nn.Module):  # the assistant prefers ids[0] (its argmax, raw q about 0.3)
        def __init__(self):
            super().__init__()
            self.weight = head.weight

        def forward(self, x):
            return head(x) + bias.to(x)

    draft.lm_head = Biased()
    processors = LogitsProcessorList([_TwoIds(ids)])
    # 3 new tokens: stock drafts nothing when only one token is left after the prefill's
    kwargs = dict(do_sample=True, max_new_tokens=3, logits_processor=processors, assistant_model=draft)
    try:
        torch.manual_seed(seed)
        if speculative:
            hf_specmm.enable(model)
            rows = {k: v.expand(samples, *v.shape[1:]) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            second = model.generate(**rows, num_assistant_tokens=1, **kwargs)[:, -2]
        else:
            draft.generation_config.num_assistant_tokens = 1
            second = torch.cat([model.generate(**inputs, **kwargs)[:, -2] for _ in range(samples)])
    finally:
        hf_specmm.disable(model)
        draft.lm_head = head
    assert bool(((second == ids[0]) | (second == ids[1])).all())
    return float((second == ids[0]).float().mean())


def test_fifty_fifty_target_stock_is_biased_and_this_kind_is_not():
    """Stock's generator drafts the argmax and verifies it against the softmax of the raw logits: with the target
    split 50/50, the assistant's favourite comes out far more than half the time. This kind draws from q and
    verifies against it: a binomial 50 % (a 4.5-sigma band over 300 draws)."""
    model = target("gemma4")
    inputs = batch_inputs("gemma4", 1, with_images=False)
    draft = assistant(model)
    samples = 300
    ours = fifty_fifty_share(model, draft, inputs, samples, speculative=True)
    stock = fifty_fifty_share(model, draft, inputs, samples, speculative=False)
    band = 4.5 * (0.25 / samples) ** 0.5
    print(f"share of the assistant's favourite at 50/50: stock {stock:.2f}, gemma4_assistant {ours:.2f} "
          f"({samples} draws)")
    assert abs(ours - 0.5) < band
    assert stock - 0.5 > band


def test_refusals_before_any_forward():
    from hf_specmm.drafts.gemma4_assistant import tiny_assistant

    model = target("gemma4")
    draft = tiny_assistant(model)
    llava = target("llava")
    for other, inputs, match in ((llava, batch_inputs("llava", 1), "shares no K/V|has none"),):
        hf_specmm.enable(other)
        try:
            with count_forwards(other, draft) as calls, pytest.raises(IncompatibleDraftError, match=match):
                other.generate(**inputs, max_new_tokens=4, assistant_model=draft)
        finally:
            hf_specmm.disable(other)
        assert calls["n"] == 0
    wrong = copy.deepcopy(draft)
    wrong.config.backbone_hidden_size = 48
    flash = copy.deepcopy(draft)
    flash.config._attn_implementation = "flash_attention_2"  # set as from_pretrained(attn_implementation=...) sets it
    inputs = batch_inputs("gemma4", 1)
    hf_specmm.enable(model)
    try:
        for bad, match in ((wrong, "backbone_hidden_size"), (flash, "attn_implementation='flash_attention_2'.*sdpa")):
            with count_forwards(model, bad) as calls, pytest.raises(IncompatibleDraftError, match=match):
                model.generate(**inputs, max_new_tokens=4, assistant_model=bad)
            assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


def _proposals(model, inputs, draft, **kwargs):
    from hf_specmm.drafts.gemma4_assistant import Gemma4AssistantDrafter

    seen, real = [], Gemma4AssistantDrafter.propose

    def propose(self, budget, select, cur):
        proposal = real(self, budget, select, cur)
        seen.append(proposal.tokens.tolist())
        return proposal

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Gemma4AssistantDrafter, "propose", propose)
        out, _ = _generate(model, inputs, draft, **kwargs)
    return out, seen


@pytest.mark.parametrize("variant", VARIANTS)
def test_static_cache_reads_what_the_dynamic_cache_reads(variant):
    """The same proposals, round by round, from a static target cache as from a dynamic one (batch 3, left padding):
    the K/V slots, masks and positions the assistant reads do not depend on the backend. The unshared targets read
    text rows: with an image, stock's own plain static greedy already differs from its dynamic one there (its
    static prefill's logits, not the assistant's reading)."""
    unshared = variant.endswith("-unshared")
    model, inputs = _target(variant), batch_inputs(_family(variant), 3, with_images=not unshared)
    draft = assistant(model)
    common = dict(max_new_tokens=NEW_TOKENS, num_assistant_tokens=3)
    dynamic, dynamic_proposals = _proposals(model, inputs, draft, **common)
    static, static_proposals = _proposals(model, inputs, draft, cache_implementation="static", **common)
    assert torch.equal(dynamic, static)
    rounds = min(len(dynamic_proposals), len(static_proposals))
    assert rounds >= 6
    for a, b in zip(dynamic_proposals[:rounds], static_proposals[:rounds]):
        if len(a) == len(b):  # the static cache keeps finished rows; the dynamic one drops them
            for x, y in zip(a, b):  # a static cache drafts its fixed γ to the end; a dynamic one what is left
                assert x[:len(y)] == y[:len(x)]


def test_auto_and_saved_assistant(tmp_path):
    """``hf_specmm.Auto`` (rounds that may be plain target steps: ``Drafter.follow``) equals plain greedy; a saved
    assistant loads back through ``hf_specmm.load_draft`` as stock's class."""
    model, inputs = target("gemma4"), batch_inputs("gemma4", 3)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    draft = assistant(model)
    assert draft.generation_config.num_assistant_tokens == 3  # as stock's assistants ship: Auto's choice replaces it
    out, stats = _generate(model, inputs, hf_specmm.Auto(draft), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, plain)
    draft.save_pretrained(tmp_path)
    loaded = hf_specmm.load_draft(str(tmp_path))
    assert type(loaded) is type(draft) and hf_specmm.kind_of(loaded).name == "gemma4_assistant"
    out, _ = _generate(model, inputs, loaded, max_new_tokens=NEW_TOKENS, num_assistant_tokens=3)
    assert torch.equal(out, plain)


def test_training_an_assistant_is_refused_before_any_model_loads(tmp_path):
    """hf_specmm runs Gemma 4 assistants but does not train them: ``--draft-kind gemma4_assistant`` is refused by
    the config check, and a saved assistant given as ``--draft`` is refused before the trainer is built."""
    from hf_specmm.train.config import TrainConfig, TrainingInputError
    from hf_specmm.train.models import make_draft

    with pytest.raises(TrainingInputError, match="draft_kind='gemma4_assistant': hf_specmm runs Gemma 4 assistant "
                                                 "drafts but does not train them \\(trainable kinds: .*text_only"):
        TrainConfig(target="t", data="d", output_dir=str(tmp_path), draft_kind="gemma4_assistant").validate()
    model = target("gemma4")
    assistant(model).save_pretrained(tmp_path / "assistant")
    cfg = TrainConfig(target="t", data="d", output_dir=str(tmp_path / "run"), draft=str(tmp_path / "assistant"))
    with count_forwards() as calls, pytest.raises(TrainingInputError, match="which hf_specmm runs but does not train"):
        make_draft(cfg, model, None, "t")
    assert calls["n"] == 0
