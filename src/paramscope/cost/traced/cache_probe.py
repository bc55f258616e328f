"""The real cache, measured: a prefill on the meta device, and the bytes of every tensor the cache object holds.

No memory is used (meta tensors have shapes and dtypes, no storage) and it takes well under a second, so it can
answer what only the implementation knows: whether a class caches MLA latents or expanded heads, and what a
recurrent layer keeps. The analytic formulas in memory/kv.py are tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProbedCache:
    bytes: int
    layers: tuple[tuple[str, int], ...]  # (cache layer class, bytes) in order
    cache_class: str


def probe_cache(module: Any, *, batch: int, seq: int, encoder_seq: int | None = None) -> ProbedCache | None:
    """Run `module` (built on meta) on `batch` × `seq` token ids with use_cache; None when it cannot run so."""
    import torch

    from ...build import quiet_transformers

    config = getattr(module, "config", None)
    kwargs: dict[str, Any] = {"use_cache": True}
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    if getattr(config, "is_encoder_decoder", False):
        kwargs["input_ids"] = torch.zeros((batch, encoder_seq or seq), dtype=torch.long, device="meta")
        kwargs["decoder_input_ids"] = ids
    else:
        kwargs["input_ids"] = ids
    try:
        with quiet_transformers(), torch.no_grad():
            output = module(**kwargs)
    except Exception:  # broad on purpose: the model's own forward cannot run on meta (data-dependent ops): no probe
        return None
    with quiet_transformers():  # transformers ≥ 5.24 calls it `cache`, and warns on the older names
        cache = next((value for value in (getattr(output, name, None) for name in
                                          ("cache", "past_key_values", "cache_params")) if value is not None), None)
    if cache is None:
        return None
    layers: list[tuple[str, int]] = []
    for layer in _cache_layers(cache):
        layers.append((type(layer).__name__, _tensor_bytes(vars(layer))))
    return ProbedCache(sum(b for _, b in layers), tuple(layers), type(cache).__name__)


def _cache_layers(cache: Any) -> list[Any]:
    caches = [getattr(cache, "self_attention_cache", None), getattr(cache, "cross_attention_cache", None)]
    caches = [c for c in caches if c is not None] or [cache]
    return [layer for c in caches for layer in getattr(c, "layers", ())]


def _tensor_bytes(value: Any, depth: int = 0) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if depth > 3:
        return 0
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, depth + 1) for v in value)
    return 0


def traced_prefill_peak(model_class: Any, config: Any, *, batch: int, seq: int, dtype: str = "bfloat16") -> int:
    """The peak bytes torch's MemTracker sees over a prefill of `model_class(config)` on fake tensors.

    The traced engine's serving step (traced/step.py) without decode steps: as generate() runs the prefill (use_cache,
    last-token logits) for a model that generates, else a plain forward over every token (an encoder). The class
    is built on meta in `dtype`; nothing real is allocated. The analytic workspace in memory/prefill.py is tested against
    this."""
    import copy

    import torch

    from .step import StepSettings, trace_inference

    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device("meta"):
            model = model_class(copy.deepcopy(config))
    finally:
        torch.set_default_dtype(previous)
    return trace_inference(model, StepSettings(batch=batch, seq=seq, decode_steps=0)).phases[0].bytes
