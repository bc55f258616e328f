"""Which family's tower input paramscope lays out (media_family), and media_flops: the FLOPs of a model's tower and
projector on an image or audio input, the family's trace (image_families.py, cross_attention.py) run under a
progress line."""

from __future__ import annotations

from typing import Any

from ...errors import OptionError, UnsupportedError
from .cross_attention import trace_mllama, trace_whisper
from .image_families import trace_gemma3, trace_llava, trace_qwen2_5_vl
from .media import MediaFlops, MediaInput
from .trace import TraceStep

_FAMILIES = {"gemma3": trace_gemma3, "llava": trace_llava, "qwen2_5_vl": trace_qwen2_5_vl, "whisper": trace_whisper,
             "mllama": trace_mllama}


def media_family(config: Any) -> str | None:
    """The family whose tower input paramscope lays out, from the config's model_type; None for any other."""
    kind = getattr(config, "model_type", None)
    return kind if kind in _FAMILIES else None


def media_flops(module: Any, media: MediaInput, *, batch: int, seq: int, training: bool,
                precision: str | None = None, attention: str | None = None,
                frozen: frozenset[str] = frozenset(), serving_dtype: str | None = None) -> MediaFlops:
    """Trace the tower (and projector) of `module` (built on meta) on `batch` sequences' images or audio. With a
    training `precision` ("bf16-mixed", …) the trace runs as that step runs it (the weights' dtype, autocast) and
    also measures what the towers save for backward (MediaFlops.saved_bytes), with the step's `attention` (None: the
    model's own). `frozen`: parameter names that do not train (--freeze): no weight gradient, and no input gradient
    where nothing before them trains. With `serving_dtype` (a forward, "bfloat16", …) the trace also measures the
    forward's peak in that dtype (MediaFlops.forward_peak), with the model's own attention."""
    media.check()
    config = getattr(module, "config", None)
    family = media_family(config)
    if family is None:
        raise UnsupportedError("{name} ({kind}): image and audio inputs are counted for Gemma-3, LLaVA, Qwen2.5-VL, "
                               "Llama-3.2-Vision and Whisper; a text input counts its language model only", name=type(module).__name__,
                               kind=getattr(config, "model_type", None) or "no model_type")
    layout = _FAMILIES[family]
    if media.audio_seconds is not None and family != "whisper":
        raise OptionError("{0} is for an audio tower (Whisper); {name} reads images: use {1} or {2}", "audio_seconds",
                          "images", "image_tokens", name=type(module).__name__)
    if media.audio_seconds is None and family == "whisper":
        raise OptionError("{name} reads audio: give {0}", "audio_seconds", name=type(module).__name__)
    from ... import progress

    with progress.status(f"counting {type(module).__name__}'s {'audio' if family == 'whisper' else 'vision'} tower on "
                         "fake tensors (FlopCounterMode)"):
        return layout(module, media, batch, seq, TraceStep(training, precision if training else None, attention,
                                                           frozenset(frozen) if training else frozenset(),
                                                           None if training else serving_dtype))
