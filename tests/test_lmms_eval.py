"""lmms-eval integration: the world task folder (always), and where lmms-eval is installed (CI: the newest
transformers leg, scripts/test.sh) lmms-eval run end to end on it, plain vs drafts: the same per-sample outputs and
the same scores; a copy of the target as its own draft is accepted 100 %; bad model_args refused before loading;
the lmms-eval CLI with a draft named as a Hub repo (offline, from the Hub cache)."""

from __future__ import annotations

import json

import pytest

from hf_specmm.train.data import Example, format_prompt
from hf_specmm.world import lmms_task
from hf_specmm.world.shipped import CHECKPOINTS
from hf_specmm.world.target import build_world_processor

try:
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    from hf_specmm.integrations.lmms_eval.model import HFSpecMM, ModelArgsError
except Exception as err:  # noqa: BLE001 - any import failure means: not installed here
    simple_evaluate = None
    MISSING = (f"lmms-eval is not importable here ({type(err).__name__}: {err}); CI installs it in the newest "
               "transformers leg (scripts/test.sh)")
needs_lmms = pytest.mark.skipif(simple_evaluate is None, reason=MISSING if simple_evaluate is None else "")
TARGET = CHECKPOINTS / "world-target"


def test_world_task_folder_is_deterministic_and_scored(tmp_path):
    a = lmms_task.write_world_task(tmp_path / "a", per_task=3)
    b = lmms_task.write_world_task(tmp_path / "b", per_task=3)
    files = sorted(p.name for p in a.iterdir())
    assert files == ["caption.jsonl", "hf_specmm_world.yaml", "hf_specmm_world_caption.yaml",
                     "hf_specmm_world_vqa.yaml", "vqa.jsonl"]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    docs = [json.loads(line) for line in (a / "vqa.jsonl").read_text().splitlines()]
    assert len(docs) == 3 and docs[0]["answer"] and docs[0]["question"].endswith("?")
    (image,) = lmms_task.doc_to_visual(docs[0])
    assert image.size == (48, 48) and image.mode == "RGB"
    assert lmms_task.vqa_results(docs[0], [docs[0]["answer"] + " "]) == {"exact_match": 1.0}
    assert lmms_task.vqa_results(docs[0], ["purple"]) == {"exact_match": 0.0}
    caption = json.loads((a / "caption.jsonl").read_text().splitlines()[0])
    assert lmms_task.caption_results(caption, ["a red circle"]) == {"exact_match": 0.0,
                                                                   "bleu": (caption["answer"], "a red circle")}
    assert "process_results: !function hf_specmm.world.lmms_task.caption_results" in \
        (a / "hf_specmm_world_caption.yaml").read_text()


@pytest.mark.parametrize("processor", ["shipped", "built"])
def test_world_chat_template_renders_the_trained_prompt(processor):
    """lmms-eval's chat models send the chat template's text: it must be the raw prompt the target learnt."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(TARGET) if processor == "shipped" else build_world_processor()
    example = Example(line=1, source="-", prompt="what color is the circle ?", image="x.png")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": example.prompt}]}]
    chat = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == format_prompt(proc, example, "raw") == "<image> what color is the circle ?"
    with pytest.raises(Exception, match="one user turn"):
        proc.apply_chat_template([{"role": "system", "content": "be brief"}] + messages, tokenize=False)


@needs_lmms
@pytest.mark.parametrize("args, message", [
    ({"foo": 1}, "does not know the model_args foo"),
    ({"draft": "x", "gamma": 3, "tree": "2:3:6"}, "leave gamma out"),
    ({"draft": "x", "tree": "2,3,6"}, "expected K:D:N"),
    ({"draft": "x", "tree": "2:1:9"}, "exceeds"),
    ({"draft": "x", "draft_kind": "medusa"}, "not a draft kind"),
    ({"gamma": 3}, "without draft="),
    ({"draft": "x", "gamma": 0}, "gamma must be"),
    ({"batch_size": "auto"}, "batch_size must be"),
    ({"dtype": "float33"}, "not a torch dtype"),
])
def test_bad_model_args_refused_before_loading(args, message):
    with pytest.raises(ModelArgsError, match=message):  # a missing checkpoint would be an OSError instead
        HFSpecMM(pretrained="/nonexistent/target", **args)


@needs_lmms
def test_batch_size_from_model_args_or_the_option_not_two_different_ones():
    with pytest.raises(ModelArgsError, match="batch_size given in --model_args and as an lmms-eval option"):
        HFSpecMM.create_from_arg_string("pretrained=/nonexistent,batch_size=8", {"batch_size": "4", "device": None})
    with pytest.raises(OSError):  # lmms-eval's default --batch_size 1 yields: on to loading (nothing there)
        HFSpecMM.create_from_arg_string("pretrained=/nonexistent,batch_size=8", {"batch_size": 1})


@needs_lmms
def test_draft_of_another_kind_than_asked_is_refused():
    with pytest.raises(ModelArgsError, match="is a 'text_only' draft, not draft_kind='eagle3'"):
        HFSpecMM(pretrained=str(TARGET), draft=str(CHECKPOINTS / "text-only-draft"), draft_kind="eagle3",
                 dtype="float32", device="cpu")


@needs_lmms
def test_lmms_eval_world_task_plain_vs_drafts_same_outputs_and_scores(tmp_path):
    folder = lmms_task.write_world_task(tmp_path / "task", per_task=4)
    manager = TaskManager(include_path=str(folder), include_defaults=False)  # offline: only the world task
    base = f"pretrained={TARGET},batch_size=4,dtype=float32,device=cpu"
    runs = {"plain": base,
            "text-only, γ 3": f"{base},draft={CHECKPOINTS / 'text-only-draft'},gamma=3",
            "image-adapter tree": f"{base},draft={CHECKPOINTS / 'image-adapter-draft'},tree=2:3:6",
            "the target itself": f"{base},draft={TARGET},draft_kind=vlm"}
    results = {name: simple_evaluate(model="hf_specmm", model_args=args, tasks=[lmms_task.GROUP], task_manager=manager,
                                     log_samples=True, bootstrap_iters=0, verbosity="WARNING")
               for name, args in runs.items()}

    def outputs(result):
        return {(task, s["doc_id"]): s["filtered_resps"] for task, samples in result["samples"].items()
                for s in samples}

    def scores(result):
        return {task: {k: v for k, v in metrics.items() if "stderr" not in k}
                for task, metrics in result["results"].items()}

    plain = results["plain"]
    assert len(outputs(plain)) == 8 and scores(plain)[lmms_task.TASK_NAMES["caption"]]["bleu,none"] > 50
    for name, result in results.items():
        assert outputs(result) == outputs(plain), name
        assert scores(result) == scores(plain), name
        stats = result["throughput"]
        assert stats["avg_hf_specmm_new_tokens"] == plain["throughput"]["avg_hf_specmm_new_tokens"] > 8
        if name != "plain":
            assert stats["avg_hf_specmm_tau"] > 1.5, name
    assert "avg_hf_specmm_tau" not in plain["throughput"]
    assert results["the target itself"]["throughput"]["avg_hf_specmm_acceptance"] == 1.0


def test_world_task_command(tmp_path, capsys):
    from hf_specmm import cli

    assert cli.main(["world-task", str(tmp_path / "t"), "--per-task", "1"]) == 0
    assert "--include_path" in capsys.readouterr().out
    assert len((tmp_path / "t" / "vqa.jsonl").read_text().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main(["world-task", str(tmp_path / "u"), "--per-task", "0"])
    assert exc.value.code == 2 and not (tmp_path / "u").exists()


@needs_lmms
def test_lmms_eval_cli_with_a_draft_by_hub_name(tmp_path):
    """`lmms-eval --model hf_specmm` through the CLI and the entry point, the draft named as a Hub repo (read from
    the Hub cache offline: load_draft's one path), answers as plain generate does."""
    import os
    import subprocess
    import sys

    from fake_hub import populate_hf_cache

    from hf_specmm.integrations.lmms_eval.compare import load_run

    folder = lmms_task.write_world_task(tmp_path / "task", per_task=3)
    populate_hf_cache(tmp_path / "hub", "hf-specmm/world-image-adapter-draft", CHECKPOINTS / "image-adapter-draft")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "OMP_NUM_THREADS": "1"}
    args = f"pretrained={TARGET},draft=hf-specmm/world-image-adapter-draft,batch_size=3,dtype=float32,device=cpu"
    task = lmms_task.TASK_NAMES["vqa"]
    subprocess.run([sys.executable, "-m", "lmms_eval", "--include_path", str(folder), "--tasks", task,
                    "--model", "hf_specmm", "--model_args", args, "--output_path", str(tmp_path / "out"),
                    "--log_samples", "--verbosity", "WARNING"], env=env, check=True, capture_output=True, timeout=300)
    hub_run = load_run("hub draft", tmp_path / "out")
    plain = simple_evaluate(model="hf_specmm", model_args=f"pretrained={TARGET},batch_size=3,dtype=float32,device=cpu",
                            tasks=[task], task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                            log_samples=True, bootstrap_iters=0, verbosity="WARNING")
    (answers,) = {len(s["filtered_resps"]) for s in plain["samples"][task]}  # in memory a list per sample
    assert answers == 1 and hub_run.outputs == {(task, s["doc_id"]): s["filtered_resps"][0]
                                                for s in plain["samples"][task]}
    assert hub_run.scores[task]["exact_match"] == plain["results"][task]["exact_match,none"]
    assert hub_run.stat("tau") >= 1 and hub_run.stat("new_tokens") == plain["throughput"]["avg_hf_specmm_new_tokens"]
