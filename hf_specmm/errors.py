"""Errors raised before any work starts. All are ``ValueError``s so callers can catch them broadly."""


class SpecMMError(ValueError):
    """Base class of every input error hf_specmm raises."""


class UnsupportedTargetError(SpecMMError):
    """The target model's class is not one hf_specmm knows how to speculate for."""


class IncompatibleDraftError(SpecMMError):
    """The draft cannot propose the target's token ids (vocabulary, context window, device)."""


class UnsupportedGenerationError(SpecMMError):
    """A generate() option that speculative decoding with a draft cannot honour."""
