"""Training an EAGLE-3 head: ``variant="eagle3"`` with training-time test and a draft vocabulary chosen from
the answers; held-out τ rises, resume gives the same head, bad EAGLE-3 options are refused up front."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from test_train import base_config, image_task, mixed_data, target_dir  # noqa: F401 - pytest fixtures


def test_training_raises_heldout_tau_with_a_draft_vocabulary(target_dir, image_task):  # noqa: F811
    from hf_specmm.train import train_draft
    root, train, heldout, classes = image_task
    result = train_draft(base_config(target_dir, root, output_dir=str(root / "eagle3"), draft_kind="feature_head",
                                     variant="eagle3", ttt_steps=2, draft_vocab_size=32, data=train,
                                     eval_data=heldout, steps=60, stage2_steps=60, lr=3e-3))
    head = result.draft
    before, after = result.tau_before, result.tau_after
    print(f"eagle3 head: τ {before['block_efficiency']:.3f} -> {after['block_efficiency']:.3f}, acceptance "
          f"{before['acceptance_rate']:.3f} -> {after['acceptance_rate']:.3f}")
    assert hf_specmm.kind_of(head).name == "eagle3" and result.global_step == 120
    assert head.d2t.numel() == 32 and int(head.t2d.sum()) == 32
    assert after["acceptance_rate"] >= before["acceptance_rate"] + 0.3, (before, after)
    assert sum(result.losses[-5:]) < 0.5 * sum(result.losses[:5])
    loaded = hf_specmm.load_draft(result.draft_dir)
    assert hf_specmm.draft_metadata(loaded)["draft_kind"] == "eagle3"
    assert torch.equal(loaded.d2t, head.d2t)


def test_answer_counts_pick_the_most_frequent_ids():
    from hf_specmm.train.data import Example
    from hf_specmm.train.run import answer_counts

    examples = [Example(1, "d", "p", response_ids=[5, 5, 9, 2]), Example(2, "d", "p", response_ids=[9, 5, 300])]
    counts = answer_counts(examples, 16)
    assert counts.tolist()[:10] == [0, 0, 1, 0, 0, 3, 0, 0, 0, 2] and counts.sum() == 6  # 300: outside the vocabulary


def test_resume_gives_the_same_head(target_dir, mixed_data):  # noqa: F811
    from hf_specmm.train import TrainingInputError, train_draft

    root, data = mixed_data
    kw = dict(data=data, draft_kind="eagle3", ttt_steps=2, draft_vocab_size=48, steps=2, stage2_steps=2,
              batch_size=4, checkpoint_every=1, eval_fraction=0.25, eval_before=False,
              response_cache=str(root / "eagle3.jsonl"))
    straight = train_draft(base_config(target_dir, root, output_dir=str(root / "e3-straight"), **kw))
    first = train_draft(base_config(target_dir, root, output_dir=str(root / "e3-split"), stop_at_step=3, **kw))
    assert not first.completed and first.global_step == 3
    second = train_draft(base_config(target_dir, root, output_dir=str(root / "e3-split"), resume="latest", **kw))
    assert second.completed and straight.losses[3:] == second.losses
    a, b = straight.draft.state_dict(), second.draft.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(TrainingInputError, match="ttt_steps"):
        train_draft(base_config(target_dir, root, output_dir=str(root / "e3-split"), resume="latest",
                                **{**kw, "ttt_steps": 3}))
    with pytest.raises(TrainingInputError, match="EAGLE-3 heads"):
        base_config(target_dir, root, draft_kind="feature_head", ttt_steps=2, data=data).validate()
