"""Draft kinds as registered plugins (PEFT's ``register_peft_method`` style).

Each kind lives in ``hf_specmm/drafts/<kind>/`` and calls :func:`register_draft_kind` once in its
``__init__``. Everything else (api, checks, hub, training, the miniature world) looks the kind up here
instead of testing classes. Adding a kind = one folder + one registration + an import line in
``drafts/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DraftLoadError, IncompatibleDraftError

if TYPE_CHECKING:
    from ..drafter import Drafter
    from ..vocab import VocabMap


def _no_rows(draft: Any) -> str:
    return ""


def _itself(draft: Any) -> Any:
    return draft


@dataclass(frozen=True)
class DraftKind:
    """One kind of draft.

    Attributes:
        name: the kind's id (``--draft-kind``, ``draft_kind`` in saved configs and cards).
        title: how cards and tables name it ("image-adapter").
        drafter: the :class:`~hf_specmm.drafter.Drafter` subclass that runs it (its ``check`` too).
        claims: whether a draft object is of this kind; asked in decreasing ``priority``.
        loads: for a saved draft's config, the class that loads it (None: not this kind's checkpoint).
        language_model: the causal LM inside the draft (what the card describes).
        card_rows: extra rows for the model card's architecture table (markdown, each ending in a newline).
        stages: training stages this kind has (1 = language, 2 = multimodal); the first is the default.
        training_view: ``(draft, vocab, stage) -> Drafter`` whose ``model`` is run on training batches; None: a
            kind hf_specmm runs but does not train (``hf-specmm train`` refuses it before loading any model).
        param_groups: ``(draft, stage, cfg) -> [{"params": ..., "lr": ...}]`` trained in that stage (None with
            ``training_view``).
        build: ``(target, language_model, cfg, target_name) -> draft`` makes this kind around a fresh or
            loaded causal LM, or None when the kind cannot be built that way.
        loss: ``(view, batch, target_logits, cfg, columns) -> (summed loss, summed metrics)`` replacing the
            trainer's token distillation of ``view.model``'s logits, for kinds whose loss needs more than
            logits (e.g. the target's hidden states as regression targets, captured by the view's ``watch``
            around the target's forward). ``target_logits`` [B, R, V]: column r predicts response token r;
            ``columns``: the proposable ids. Metrics must include ``draft_top1``. None: the default loss.
        check_config: ``(config.json as a dict, its path) -> None``: raises
            :class:`~hf_specmm.errors.DraftLoadError` naming the field when a checkpoint of this kind has a
            missing or ill-typed field; run by ``load_draft`` on every checkpoint before transformers reads it.
        block_drafter: one draft forward proposes a whole round's block (DFlash): a round's draft cost is one
            step, not γ (the bench's cost model).
        target_vocab_size: ``(draft, target) -> rows`` for kinds that score with the target's LM head (no
            vocabulary of their own): the vocabulary they propose from. None: the draft's own LM head's.
        imports: ``(config.json as a dict) -> importer or None``: for a checkpoint in another library's layout
            (vLLM's ``speculators``, SGLang) that this kind reads, ``importer(folder, target, name) -> draft``,
            which reads it as data (no code of the checkpoint runs) and refuses mismatches before any forward.
            None: the kind reads only checkpoints ``from_pretrained`` loads.
    """

    name: str
    title: str
    drafter: type["Drafter"]
    claims: Callable[[Any], bool]
    priority: int
    loads: Callable[[Any], "type | None"]
    training_view: Callable[[Any, "VocabMap", int], "Drafter"] | None
    param_groups: Callable[[Any, int, Any], list[dict]] | None
    stages: tuple[int, ...] = (1,)
    language_model: Callable[[Any], Any] = _itself
    card_rows: Callable[[Any], str] = _no_rows
    build: Callable[..., Any] | None = None
    loss: Callable[..., tuple[Any, dict[str, float]]] | None = None
    check_config: Callable[[dict, str], None] | None = None
    target_vocab_size: Callable[[Any, Any], int] | None = None
    block_drafter: bool = False
    imports: Callable[[dict], Callable[..., Any] | None] | None = None
    #: ``(target checkpoint folder or Hub id, target, fetch) -> draft``: the kind's draft read out of a target's own
    #: checkpoint (``load_draft(name, kind=..., target=...)``; an MTP layer); ``fetch(file name)`` gives the file's
    #: local path (from the Hub for a Hub id) or None. None: drafts of this kind are checkpoints of their own.
    from_target_checkpoint: Callable[[str, Any, Callable[[str], Any]], Any] | None = None


_KINDS: dict[str, DraftKind] = {}


def register_draft_kind(kind: DraftKind) -> DraftKind:
    """Register ``kind`` (once, from the kind's own ``__init__``)."""
    if kind.name in _KINDS and _KINDS[kind.name] != kind:
        raise ValueError(f"draft kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_draft_kind(name: str) -> None:
    """Undo :func:`register_draft_kind` (for plugins loaded and unloaded at run time, and tests)."""
    _KINDS.pop(name, None)


def draft_kinds() -> tuple[str, ...]:
    """Names of the registered kinds, highest priority first."""
    return tuple(k.name for k in sorted(_KINDS.values(), key=lambda k: -k.priority))


def trainable_kinds() -> tuple[str, ...]:
    """Names of the registered kinds ``hf-specmm train`` trains (those with a ``training_view``)."""
    return tuple(name for name in draft_kinds() if _KINDS[name].training_view is not None)


def get_kind(name: str) -> DraftKind:
    if name not in _KINDS:
        raise ValueError(f"unknown draft kind {name!r}; registered kinds: {', '.join(draft_kinds())}")
    return _KINDS[name]


def kind_of(draft: Any) -> DraftKind:
    """The kind of a draft object: the highest-priority kind that claims it (an
    :class:`~hf_specmm.errors.IncompatibleDraftError` naming the registered kinds when none does)."""
    for name in draft_kinds():
        if _KINDS[name].claims(draft):
            return _KINDS[name]
    raise IncompatibleDraftError(
        f"no hf_specmm draft kind takes a {type(draft).__name__} as assistant_model; the registered kinds are "
        f"{', '.join(draft_kinds())} (docs/draft-kinds.md: each kind's models; a new kind registers with "
        "hf_specmm.drafts.register_draft_kind)")


def loading_class(config: Any) -> type:
    """The class that loads a saved draft with this config (highest-priority kind that claims it)."""
    for name in draft_kinds():
        cls = _KINDS[name].loads(config)
        if cls is not None:
            return cls
    raise DraftLoadError(f"no hf_specmm draft kind loads a {type(config).__name__} (model_type "
                         f"{getattr(config, 'model_type', None)!r}); the registered kinds are {', '.join(draft_kinds())} "
                         "(docs/draft-kinds.md)")


def importer_for(raw: dict) -> Callable[..., Any] | None:
    """The importer of the highest-priority kind that reads this config.json (another library's layout), or None."""
    for name in draft_kinds():
        reads = _KINDS[name].imports
        importer = None if reads is None else reads(raw)
        if importer is not None:
            return importer
    return None


def check_checkpoint_config(raw: dict, source: str) -> None:
    """Every registered kind's ``check_config`` on a checkpoint's config.json (read as data)."""
    for check in dict.fromkeys(k.check_config for k in _KINDS.values() if k.check_config is not None):
        check(raw, source)
