"""The analytic serving peak checked against the traced one on a cut of the real class, once per config and compute
dtype (engine_check.py holds the cut, the points and the store), and what answers where they differ.

    check:   a cut of the build → at each point, serving_estimate on the cut's view against generate()'s prefill
             and one decode step traced on the cut (MemTracker on fake tensors) → equal to the byte, or where not
    differs: the difference at the asked point on the cut and on a cut twice as long → the same (what the analytic
             engine misses does not grow with depth: a layer's working tensors) → the analytic answer less it, the
             KV cache and weights still the analytic ones; else one trace of the whole model, its difference the
             answer's (kept on disk beside the cuts' by serving_correction.py, so it too is traced once a point)
"""

from __future__ import annotations

from typing import Any

from ..engine_check import EngineCheck, check_cut, check_points, run_check
from .serving_correction import CutDifference

_FORMATS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
UNEQUAL_HEADS = ("{0}'s queries and values have unequal head sizes (MLA), so torch's CPU sdpa runs the math kernel "
                 "and keeps the S² scores, which a GPU's fused kernel (as the analytic engine assumes) does not")


def check_serving(module: Any, dtype: str) -> EngineCheck:
    """Hold the analytic serving peak against the traced one on a cut of `module` (built on meta in `dtype`, the
    compute dtype)."""
    from ..dims import same_head_sizes, text_config

    cut, depth, count = check_cut(module)
    points = check_points(module)
    if not same_head_sizes(text_config(module.config)):
        return EngineCheck("serving", type(module).__name__, "unchecked", depth, count, tuple(points), (dtype,),
                           UNEQUAL_HEADS.format(type(module).__name__))

    def compare() -> str:
        from ...api import inspect_module
        from ..model_view import from_module

        read = inspect_module(cut), from_module(cut)  # one view: its cache probe (B 1, S 2) serves every point
        for batch, seq in points:
            analytic, traced, phase, _ = _both(cut, dtype, batch, seq, read=read)
            if analytic != traced:
                return (f"at B={batch}, S={seq:,}, the peak {analytic:,} B analytic vs {traced:,} B traced ({phase}), "
                        f"{analytic - traced:+,} B")
        return ""

    return run_check("serving", module, compare, doing="the analytic serving memory against a traced prefill",
                     depth=depth, count=count, points=points, modes=(dtype,))


def _both(cut: Any, dtype: str, batch: int, seq: int, encoder_seq: int | None = None,
          read: tuple[Any, Any] | None = None) -> tuple[int, int, str, tuple[str, ...]]:
    """(the analytic peak, the traced peak, the traced peak's phase, the trace's notes) of `cut` at B × S, the KV
    cache as transformers keeps it in the compute dtype (what the trace holds). `read`: the cut's (report, view),
    where the caller reads them once for several points."""
    from ...api import inspect_module
    from ..model_view import from_module
    from .quantization import weight_format
    from .serving import MemoryOptions, serving_estimate, traced_serving

    options = MemoryOptions(batch=batch, seq=seq, encoder_seq=encoder_seq)
    report, view = read or (inspect_module(cut), from_module(cut))
    analytic = serving_estimate(report, view, options, weight_format(_FORMATS[dtype]), "--dtype", ())
    traced, phase, notes = traced_serving(cut, options, seq, analytic.weights)
    return analytic.peak, traced, phase, tuple(notes)


def extended_difference(module: Any, dtype: str, batch: int, seq: int,
                        encoder_seq: int | None = None) -> CutDifference:
    """analytic − traced at B × S, on the check's cut and on one twice as long, and where those two disagree (it
    grows with depth) on the whole model (CutDifference: the correction, its words, and what was traced)."""
    from ... import progress

    with progress.status(f"tracing cuts of {type(module).__name__} at B={batch}, S={seq:,}"):
        cut, short, count = check_cut(module)
        analytic, traced, *_ = _both(cut, dtype, batch, seq, encoder_seq)
        if short == count:  # the cut is the whole model: its difference is the answer's
            return CutDifference(batch, seq, short, analytic - traced, count)
        first = analytic - traced
        cut, long, _ = check_cut(module, longer=True)
        analytic, traced, *_ = _both(cut, dtype, batch, seq, encoder_seq)
    if first == analytic - traced:
        return CutDifference(batch, seq, short, first, count, long, first)
    second = analytic - traced
    with progress.status(f"tracing the whole {type(module).__name__} at B={batch}, S={seq:,} (the cuts disagree)"):
        analytic, traced, phase, notes = _both(module, dtype, batch, seq, encoder_seq)
    return CutDifference(batch, seq, short, first, count, long, second, analytic - traced, phase, notes)


__all__ = ["check_serving", "extended_difference"]
