"""A draft wrapped to change how hf_specmm drafts with it (``TextOnly``, :class:`Tree`), still reading as the draft."""

from __future__ import annotations

import warnings

from typing import Any

import torch

from ..budget import CallContext, DraftBudget
from ..errors import UnsupportedGenerationError
from ..trees.expand import TreeShape


class DraftWrapper(torch.nn.Module):
    """Wraps one draft module, stored under :attr:`wrapped_name`; every attribute the wrapper lacks (``config``,
    ``device``, ``generation_config``, ...) is read from the wrapped draft, and a call runs it."""

    wrapped_name = "model"

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules[self.wrapped_name], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._modules[self.wrapped_name](*args, **kwargs)


class Tree(DraftWrapper):
    """Wraps any draft (text-only, image-adapter, vlm, feature head, ``TextOnly(...)``) so that every round
    drafts a tree: level by level up to ``depth``, the ``top_k`` children of the ``top_k`` best frontier nodes
    (one draft forward per level), the ``nodes`` best nodes by cumulative draft probability kept; the target
    verifies all of them in one forward (tree attention mask, positions by depth) and keeps the longest
    accepted root path plus its own next token. ``Tree(draft, top_k=1, depth=γ, nodes=γ)`` is the chain
    under greedy decoding (the same outputs, forwards and statistics); under sampling both are exact, but the
    tree draws from the random stream in another order, so a seed gives other samples than the chain's.

    Options with no tree meaning are refused before any forward, naming the option:
    ``assistant_confidence_threshold`` (the tree's shape is static; a value transformers filled into an unset
    field, as 5.17's pipelines pass, is not the caller's choice and is dropped), ``num_assistant_tokens_schedule`` other
    than ``'constant'`` (the depth is fixed), ``num_assistant_tokens`` other than ``depth`` (the depth is the
    tree's γ), ``cache_implementation='static'``, ``output_attentions`` / ``output_hidden_states`` with
    ``return_dict_in_generate`` (a tree forward's per-node tensors have no plain-generate layout; scores and
    logits are returned along the accepted path). Logits processors are honoured at every node, draft side and
    target side: those that read the token history (repetition penalty, n-gram bans, min length, ...) see the
    row's history plus the node's own root path (one processor call per node and depth: slower than a chain
    with such processors, the same output as plain ``generate``). ``tokens=`` is the former name of ``nodes=``
    (accepted with a ``FutureWarning``).

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> tree = hf_specmm.Tree(testing.text_draft_from_target(testing.tiny_target("llava")), top_k=2, depth=3, nodes=6)
        >>> tree.shape
        TreeShape(top_k=2, depth=3, nodes=6)
    """

    wrapped_name = "draft"

    def __init__(self, draft: torch.nn.Module, top_k: int = 4, depth: int = 5, nodes: int | None = None, *,
                 tokens: int | None = None):
        super().__init__()
        if tokens is not None:  # the count's former name (it is no token: DraftTree.tokens holds the ids)
            if nodes is not None:
                raise ValueError(f"Tree(nodes={nodes}, tokens={tokens}): pass the node count once, as nodes=")
            warnings.warn("Tree(tokens=...) is now Tree(nodes=...): the draft nodes kept per round",
                          FutureWarning, stacklevel=2)
            nodes = tokens
        nodes = 24 if nodes is None else nodes
        if isinstance(draft, Tree):
            raise ValueError("Tree(draft): draft is already a Tree; wrap the draft itself once")
        if not isinstance(draft, torch.nn.Module):
            raise TypeError(f"Tree(draft): draft must be a draft model (torch.nn.Module), got {type(draft).__name__}")
        self.shape = TreeShape(top_k=top_k, depth=depth, nodes=nodes)  # checked: clear errors on bad shapes
        self.draft = draft

    def call_budget(self, budget: DraftBudget, call: CallContext) -> DraftBudget:
        """The call's budget: every round this tree (γ its depth). Options with no tree meaning are refused here,
        before any forward, naming the option."""
        shape, config = self.shape, call.config
        bad = None
        if budget.schedule != "constant":
            bad = (f"num_assistant_tokens_schedule={budget.schedule!r}: a tree's depth is fixed; use "
                   "num_assistant_tokens_schedule='constant' (or leave it unset)")
        elif budget.confidence is not None:
            bad = "assistant_confidence_threshold: a tree's shape is static; drop the threshold"
        elif call.gamma_source is not None and budget.gamma != shape.depth:
            bad = (f"num_assistant_tokens={budget.gamma} (from {call.gamma_source}): a tree's γ is its depth "
                   f"({shape.depth}); drop num_assistant_tokens or set it to the depth")
        elif shape.top_k > call.vocab_size:
            bad = (f"top_k={shape.top_k}: more children per node than the target's {call.vocab_size} token ids; use "
                   f"hf_specmm.Tree(draft, top_k=k) with k <= {call.vocab_size}")
        elif config.cache_implementation == "static":
            bad = "cache_implementation='static': draft trees run on the default dynamic cache; drop it"
        elif call.stateful:
            bad = (f"a {call.stateful} with stateful layers (Qwen3.5's Gated DeltaNet, Inkling's short convolutions): "
                   "a tree node's state is its parent's plus its token, which one forward over the flattened tree does "
                   "not compute; pass the draft itself to draft a chain")
        elif config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states):
            bad = ("output_attentions / output_hidden_states: a tree forward's per-node tensors have no plain-generate "
                   "layout (scores and logits are returned); drop them")
        if bad is not None:
            raise UnsupportedGenerationError(f"generate(assistant_model=hf_specmm.Tree(...)) cannot be used with {bad}.")
        budget.gamma, budget.tree = shape.depth, shape
        return budget

    @property
    def generation_config(self) -> None:
        """Refused: only hf_specmm drafts trees. Stock transformers' assisted generation (on a model without
        ``hf_specmm.enable``) reads the assistant's generation config first, and would draft a chain with the
        inner draft, ignoring the tree: it fails here instead, before any forward."""
        raise UnsupportedGenerationError(
            "generate(assistant_model=hf_specmm.Tree(...)) on a model without hf_specmm: stock transformers would "
            "draft a chain and ignore the tree. Call hf_specmm.enable(model) first (or pass tree.draft for stock's "
            "chain).")
