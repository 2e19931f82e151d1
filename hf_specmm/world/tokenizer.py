"""A word-level tokenizer that covers the miniature world exactly (built offline, no download).

Layout, like LLaVA-1.5's: ``<unk>`` = 0, ``<s>`` = 1, ``</s>`` = 2, the words (sorted) from 3,
then ``<image>`` = len(words) + 3 and ``<pad>`` after it. Padding is on the left; ``<s>`` is prepended.

Example::

    >>> tok = build_world_tokenizer()
    >>> ids = tok("what color is the circle ?")["input_ids"]
    >>> ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
    True
    >>> tok.convert_tokens_to_ids("<image>") == len(world_vocabulary()) + 3
    True
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from .tasks import SLOT_WORDS, TEMPLATES

SPECIALS_FIRST: tuple[str, ...] = ("<unk>", "<s>", "</s>")
IMAGE_TOKEN = "<image>"
PAD_TOKEN = "<pad>"


def world_vocabulary() -> list[str]:
    """Every word any task can produce, sorted: the fixed words of ``TEMPLATES`` plus all slot fillers.

    >>> "circle" in world_vocabulary() and "?" in world_vocabulary()
    True
    """
    words: set[str] = set()
    for template in TEMPLATES.values():
        for token in template.split():
            if token.startswith("{"):
                if not (token.endswith("}") and token[1:-1].isidentifier()):
                    raise ValueError(f"slot {token!r} in {template!r} is not a whole token")
                continue
            words.add(token)
    for fillers in SLOT_WORDS.values():
        words.update(fillers)
    return sorted(words)


def build_world_tokenizer() -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer over ``world_vocabulary()`` (WordLevel, whitespace split, left padding)."""
    words = world_vocabulary()
    vocab = {tok: i for i, tok in enumerate(SPECIALS_FIRST)}
    vocab.update({w: i + len(SPECIALS_FIRST) for i, w in enumerate(words)})
    vocab[IMAGE_TOKEN] = len(vocab)
    vocab[PAD_TOKEN] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False)
                             for t in (*SPECIALS_FIRST, IMAGE_TOKEN, PAD_TOKEN)])
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token=PAD_TOKEN, padding_side="left")
    tok.image_token = IMAGE_TOKEN  # what LLaVA processors look up
    return tok
