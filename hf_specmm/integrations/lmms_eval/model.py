"""``--model hf_specmm``: lmms-eval's ``huggingface`` chat model with a draft.

What lmms-eval does with requests is its ``huggingface`` wrapper's own code, inherited unchanged: chat
templates, images, batching, per-task generation settings, output decoding and its throughput log. This
class loads the model itself (that wrapper's loader picks ``AutoModel``, a model without ``generate``, for
every vision-language model on transformers 5: it compares ``model_type`` strings with the auto classes'
config-class keys; it also fixes bfloat16), then adds the draft: it checks the extra ``model_args`` before
anything is loaded, loads the draft with :func:`hf_specmm.load_draft` (a Hub id or a local folder, one
path), enables hf_specmm on the target and adds ``assistant_model`` (and γ) to the wrapper's
``model.generate`` calls. Greedy tasks give the plain run's outputs token for token; sampled tasks the
target's distribution.

    lmms-eval --model hf_specmm --model_args pretrained=llava-hf/llava-1.5-7b-hf,draft=double7/vicuna-68m,gamma=5 \\
        --tasks mme --batch_size 8
"""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate import Accelerator
from lmms_eval import utils
from lmms_eval.api.instance import Instance
from lmms_eval.api.model import lmms
from lmms_eval.models.chat.huggingface import Huggingface
from lmms_eval.models.model_utils.gen_metrics import get_logged_metrics_history
from loguru import logger as eval_logger
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

from ... import api
from ...checks import DEFAULT_GAMMA
from ...drafts import draft_kinds, kind_of
from ...errors import SpecMMError
from ...hub import load_draft
from ...targets import SUPPORTED_TARGETS, family_by_model_type
from ...drafts.wrapper import Tree
from ...trees import TreeShape

_DRAFT_ARGS = ("draft", "draft_kind", "draft_revision", "gamma", "tree")
# what the huggingface wrapper's request handling reads, plus dtype (its other arguments are unused there)
_MODEL_ARGS = ("pretrained", "dtype", "device", "device_map", "batch_size", "attn_implementation", "use_cache",
               "system_prompt", "reasoning_prompt", "trust_remote_code")
_ATTENTION = (None, "sdpa", "eager", "flash_attention_2")


class ModelArgsError(SpecMMError):
    """A ``--model_args`` value hf_specmm's lmms-eval model cannot use (raised before anything is loaded)."""


def parse_tree(text: str) -> TreeShape:
    """``tree=K:D:N`` (top_k, depth, nodes; colons because ``--model_args`` splits on commas).

        >>> parse_tree("8:6:48")
        TreeShape(top_k=8, depth=6, nodes=48)
    """
    try:
        top_k, depth, nodes = (int(part) for part in str(text).split(":"))
        return TreeShape(top_k=top_k, depth=depth, nodes=nodes)
    except ValueError as error:
        raise ModelArgsError(f"tree={text!r}: expected K:D:N (top_k:depth:nodes), e.g. tree=8:6:48 "
                             f"({error})") from None


def check_model_args(draft: str | None, draft_kind: str | None, gamma: Any, tree: Any, batch_size: Any,
                     unknown: dict[str, Any]) -> TreeShape | None:
    """Refuse what cannot be honoured, naming the argument; returns the tree shape (None: a chain)."""
    if unknown:
        raise ModelArgsError(f"hf_specmm does not know the model_args {', '.join(sorted(unknown))}; it accepts "
                             f"{', '.join(_MODEL_ARGS + _DRAFT_ARGS)} (see docs/lmms-eval.md)")
    if not (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1):
        raise ModelArgsError(f"batch_size must be an integer >= 1, got {batch_size!r} ('auto' is not supported)")
    if draft is None:
        given = {name: value for name, value in (("draft_kind", draft_kind), ("gamma", gamma), ("tree", tree))
                 if value is not None}
        if given:
            raise ModelArgsError(f"{', '.join(given)} given without draft=<Hub id or folder>: nothing would use them")
        return None
    if draft_kind is not None and draft_kind not in draft_kinds():
        raise ModelArgsError(f"draft_kind={draft_kind!r} is not a draft kind; known kinds: {', '.join(draft_kinds())}")
    if gamma is not None and (not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1):
        raise ModelArgsError(f"gamma must be an integer >= 1, got {gamma!r}")
    if tree is None:
        return None
    if gamma is not None:
        raise ModelArgsError(f"gamma={gamma} with tree={tree}: a tree's depth D is its γ; leave gamma out")
    return parse_tree(tree)


class HFSpecMM(Huggingface):
    """lmms-eval's ``huggingface`` chat model with ``draft`` (Hub id or local folder), ``draft_kind`` (the kind
    the draft must be; default: whatever the checkpoint is), ``gamma`` (draft tokens per round, constant;
    default 5), ``tree=K:D:N`` (an EAGLE-2 tree instead of a chain) and ``draft_revision``. Without ``draft``
    it is the plain baseline, timed the same way.

    ``dtype`` defaults to ``bfloat16`` (as the ``huggingface`` model); ``device`` to ``cuda`` when one is
    visible, else ``cpu``; ``device_map`` to ``auto`` on a GPU, else the device. Under ``accelerate launch``
    each process takes its own GPU (data parallel). ``trust_remote_code`` (default False) covers target,
    processor and draft.
    """

    is_simple = False

    def __init__(self, pretrained: str, draft: str | None = None, draft_kind: str | None = None,
                 draft_revision: str | None = None, gamma: int | None = None, tree: str | None = None,
                 dtype: str = "bfloat16", device: str | None = None, device_map: str | None = None,
                 batch_size: int | str = 1, attn_implementation: str | None = None, use_cache: bool = True,
                 system_prompt: str | None = None, reasoning_prompt: str | None = None,
                 trust_remote_code: bool = False, **unknown: Any) -> None:
        lmms.__init__(self)  # not Huggingface.__init__: its loader is what this one replaces (module docstring)
        batch_size = int(batch_size) if isinstance(batch_size, str) and batch_size.isdigit() else batch_size
        shape = check_model_args(draft, draft_kind, gamma, tree, batch_size, unknown)
        if attn_implementation not in _ATTENTION:
            raise ModelArgsError(f"attn_implementation must be one of {_ATTENTION}, got {attn_implementation!r}")
        if dtype != "auto" and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ModelArgsError(f"dtype={dtype!r} is not a torch dtype (bfloat16, float16, float32, auto)")
        config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
        if draft is not None and family_by_model_type(config.model_type) is None:  # before any weight is loaded
            raise ModelArgsError(f"{pretrained} is a {config.model_type!r} model: hf_specmm speculates for "
                                 f"{', '.join(sorted(SUPPORTED_TARGETS))}")

        self.accelerator = accelerator = Accelerator()
        if accelerator.num_processes > 1:  # data parallel: one GPU per process
            self._device = torch.device(f"cuda:{accelerator.local_process_index}")
            self.device_map = f"cuda:{accelerator.local_process_index}"
        else:
            self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.device_map = device_map or ("auto" if self._device.type == "cuda" else str(self._device))
        self._model = _model_class(config).from_pretrained(
            pretrained, dtype=dtype, device_map=self.device_map, trust_remote_code=trust_remote_code,
            **({"attn_implementation": attn_implementation} if attn_implementation else {})).eval()
        self.processor = _MediaArguments(AutoProcessor.from_pretrained(pretrained, trust_remote_code=trust_remote_code))
        self._tokenizer = self.processor.tokenizer
        self._tokenizer.padding_side = "left"  # batched generation (the wrapper pads with the processor)
        prompt = reasoning_prompt or system_prompt  # as the huggingface model reads them
        self.system_prompt = self._resolve_system_prompt(prompt.replace("\\n", "\n")) if prompt else None
        self._config = self._model.config
        self._max_length = 2048
        self.batch_size_per_gpu = batch_size
        self.use_cache = use_cache
        self._rank, self._world_size = accelerator.local_process_index, accelerator.num_processes

        self.draft_name = draft
        loaded = None if draft is None else self._load_draft(draft, draft_kind, draft_revision, trust_remote_code)
        self.speculation = _Speculation(self._model, self._tokenizer, loaded, shape,
                                        gamma if gamma is not None else DEFAULT_GAMMA)
        if accelerator.num_processes > 1:
            self._model = accelerator.prepare_model(self._model, evaluation_mode=True)

    def _load_draft(self, name: str, kind: str | None, revision: str | None, trust_remote_code: bool) -> Any:
        target = self._model
        draft = load_draft(name, target=target, revision=revision, trust_remote_code=trust_remote_code)
        if kind is not None and kind_of(draft).name != kind:
            raise ModelArgsError(f"draft={name} is a {kind_of(draft).name!r} draft, not draft_kind={kind!r}")
        embeddings = target.get_input_embeddings().weight  # where the wrapper's inputs meet the target
        return draft.to(device=embeddings.device, dtype=target.dtype).eval()

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "HFSpecMM":
        """As lmms-eval's, except that ``batch_size`` in ``--model_args`` wins over lmms-eval's ``--batch_size``
        when that is its default, 1 (lmms-eval passes both, which would collide); other clashes are refused."""
        args = utils.simple_parse_args_string(arg_string)
        options = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "batch_size" in args and str(options.get("batch_size", 1)) == "1":
            options.pop("batch_size", None)
        clash = sorted(set(args) & set(options))
        if clash:
            raise ModelArgsError(f"{', '.join(clash)} given in --model_args and as an lmms-eval option: give one")
        return cls(**args, **options)

    def loglikelihood(self, requests: list[Instance]) -> list:
        raise NotImplementedError("hf_specmm runs generation tasks (generate_until); lmms-eval's huggingface chat "
                                  "model it builds on has no loglikelihood either")

    def generate_until(self, requests: list[Instance]) -> list:
        self.speculation.check_requests(requests)
        logged = len(get_logged_metrics_history())
        self.speculation.reset()
        results = super().generate_until(requests)
        stats = self.speculation.summary()
        eval_logger.info(f"hf_specmm ({self.draft_name or 'no draft'}): {stats}")
        entries = get_logged_metrics_history()[logged:]
        if len(entries) == 1:  # the wrapper's throughput entry (the same dict object): results["throughput"]
            entries[0].update({f"hf_specmm_{k}": v for k, v in stats.items() if v is not None})
        else:
            eval_logger.warning(f"hf_specmm: lmms-eval logged {len(entries)} throughput entries for one call, "
                                "expected 1: the speculative statistics above are not in results['throughput']")
        return results


class _MediaArguments:
    """The processor, called as lmms-eval 0.7.3's huggingface wrapper calls it: ``images=``, ``videos=`` and
    ``audios=`` lists, empty when a batch has none. Transformers 5 refuses ``audios`` (it is ``audio``) and
    processors without a video part refuse ``videos`` even empty, so empty lists are left out and
    ``audios`` is passed as ``audio``; everything else is the processor's own."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, *args: Any, images: Any = None, videos: Any = None, audios: Any = None, **kwargs: Any) -> Any:
        media = {name: value for name, value in (("images", images), ("videos", videos), ("audio", audios)) if value}
        return self.processor(*args, **media, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.processor, name)


def _model_class(config: Any) -> type:
    """The auto class with a ``generate`` for this config: image-text-to-text, else causal LM."""
    for auto in (AutoModelForImageTextToText, AutoModelForCausalLM):
        if type(config) in auto._model_mapping:
            return auto
    raise ModelArgsError(f"a {config.model_type!r} checkpoint has no image-text-to-text or causal-LM class in "
                         "transformers: nothing to generate with")


class _Speculation:
    """Wraps the target's ``generate``: adds the draft (when attached) and times every call, so the plain
    baseline and the draft run are measured alike (wall time, new tokens up to each row's EOS, τ)."""

    def __init__(self, model: Any, tokenizer: Any, draft: Any, shape: TreeShape | None, gamma: int) -> None:
        self.model, self.assistant, self.extra = model, None, {}
        if draft is not None:
            api.enable(model)
            if shape is not None:
                self.assistant = Tree(draft, top_k=shape.top_k, depth=shape.depth, nodes=shape.nodes)
            else:
                self.assistant = draft
                self.extra = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant"}
            # SmolVLM / Idefics3 and InternVL targets read their image-layout tokens from it; harmless elsewhere
            self.extra["tokenizer"] = tokenizer
        self.reset()
        self._generate = model.generate  # stock, or hf_specmm's once enabled
        model.generate = self  # an instance attribute, as hf_specmm.enable's own

    def reset(self) -> None:
        self.seconds, self.new_tokens = 0.0, 0
        self.generated, self.forwards, self.drafted, self.accepted = 0, 0, 0, 0

    def check_requests(self, requests: list[Instance]) -> None:
        """Refuse, before any request runs, task settings that speculative decoding cannot honour."""
        if self.assistant is None:
            return
        for request in requests:
            gen_kwargs = request.args[2] if len(request.args) > 2 and isinstance(request.args[2], dict) else {}
            if int(gen_kwargs.get("num_beams", 1) or 1) > 1:
                raise ModelArgsError(f"task {request.task_name} asks for num_beams={gen_kwargs['num_beams']}: beam "
                                     "search has no speculative equivalent; run it without draft=")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.assistant is not None:
            kwargs = {**kwargs, "assistant_model": self.assistant, **self.extra}
        start = time.perf_counter()
        out = self._generate(*args, **kwargs)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        self.seconds += time.perf_counter() - start
        prompt = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[1]
        eos = kwargs.get("eos_token_id", self.model.generation_config.eos_token_id)
        self.new_tokens += _tokens_to_eos(out[:, prompt:], eos)
        if self.assistant is not None:
            stats = api.last_stats(self.model)
            self.generated += stats.generated_tokens
            self.forwards += stats.target_forwards
            self.drafted += stats.drafted_tokens
            self.accepted += stats.accepted_tokens
        return out

    def summary(self) -> dict[str, float | int | None]:
        """Totals of the calls since :meth:`reset`; ``tau`` and ``acceptance`` are None without a draft."""
        drafted = self.assistant is not None
        return {"generate_seconds": round(self.seconds, 4), "new_tokens": self.new_tokens,
                "tokens_per_s": round(self.new_tokens / self.seconds, 2) if self.seconds else None,
                "tau": round(self.generated / self.forwards, 4) if drafted and self.forwards else None,
                "acceptance": round(self.accepted / self.drafted, 4) if drafted and self.drafted else None,
                "target_forwards": self.forwards if drafted else None}


def _tokens_to_eos(new: torch.Tensor, eos: Any) -> int:
    """Tokens each row generated up to and including its first EOS (the rest is padding)."""
    eos_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=new.device)
    if new.numel() == 0 or eos_ids.numel() == 0:
        return new.numel()
    is_eos = torch.isin(new, eos_ids)
    ended = is_eos.any(dim=1)
    lengths = torch.where(ended, is_eos.int().argmax(dim=1) + 1, torch.full_like(ended, new.shape[1], dtype=torch.long))
    return int(lengths.sum())
