"""The analytic FLOP count checked against FlopCounterMode on a cut of the real class, once per config
(engine_check.py holds the cut, the points and the store): the forward, the training step and the checkpointed step,
each at every point; the totals decide, the terms by role say where they differ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..engine_check import EngineCheck, check_cut, check_points, find_check, kept_or_made, run_check

MODES = ("forward", "training step", "checkpointed step")


def check_flops(module: Any) -> EngineCheck:
    """Hold the analytic count against FlopCounterMode's on a cut of `module` (built on meta)."""
    cut, depth, count = check_cut(module)
    points = check_points(module)
    checkpointing = bool(getattr(module, "supports_gradient_checkpointing", False))
    return run_check("flops", module, lambda: _first_difference(cut, points, checkpointing),
                     doing="the analytic FLOP count against FlopCounterMode", depth=depth, count=count, points=points,
                     modes=MODES if checkpointing else MODES[:2])


def _first_difference(cut: Any, points: list[tuple[int, int]], checkpointing: bool) -> str:
    """Where the analytic count of `cut` first differs from FlopCounterMode's, in words; "" when it never does."""
    from ...api import inspect_module
    from ..model_view import from_module
    from ..traced.flops import by_role, count_flops, module_roles
    from ..traced.step import StepSettings
    from .analytic import analytic_flops

    params = inspect_module(cut).params
    view = from_module(cut)
    roles = module_roles(params)
    for index, (batch, seq) in enumerate(points):
        at = f"at B={batch}, S={seq:,}"
        settings = StepSettings(batch=batch, seq=seq, precision="fp32")
        analytic = analytic_flops(view, params, batch=batch, seq=seq, training=True)
        if analytic is None:
            return f"{at}: the analytic engine gives no count"
        forward = count_flops(cut, settings, training=False)
        if forward.forward != analytic.forward:  # the terms that differ say where (the totals decide: a matmul
            # can be attributed to another role by each engine, DeBERTa's shared position projections)
            by_term = by_role(forward.forward_by_module, roles)
            terms = {t.role: t.flops for t in analytic.terms}
            differing = [f"{role} {terms.get(role, 0):,} analytic vs {by_term.get(role, 0):,} traced"
                         for role in sorted(set(terms) | set(by_term)) if terms.get(role, 0) != by_term.get(role, 0)]
            idle = _idle(cut, forward.forward_by_module)
            return (f"{at}, the forward {analytic.forward:,} analytic vs {forward.forward:,} traced"
                    + (": " + "; ".join(differing) if differing else "")
                    + (f"; the forward never ran the matmuls of {idle}" if idle else ""))
        step = count_flops(cut, settings, training=True)
        for name, a, t in (("the step's forward", analytic.forward, step.forward),
                           ("the backward", analytic.backward, step.model_backward),
                           ("the recomputation", analytic.recompute, step.recompute)):
            if a != t:
                return f"{at}, {name} {a:,} analytic vs {t:,} traced"
        if checkpointing and index < 2:  # the reruns are per layer, as the weights are: two points tell them
            checked = analytic_flops(view, params, batch=batch, seq=seq, training=True, checkpointing=True)
            rerun = count_flops(cut, dataclasses.replace(settings, grad_checkpointing=True), training=True,
                                plain=step)  # the step above is the one without checkpointing
            if checked.recompute != rerun.recompute:
                return (f"{at}, the checkpointed step's recomputation {checked.recompute:,} analytic vs "
                        f"{rerun.recompute:,} traced")
    return ""


def _idle(cut: Any, traced: Any) -> str:
    """The parts (a module path's first two names) whose matmuls the traced forward never ran, in words: a vision
    tower and its projector under a text input."""
    from ..model_view import is_matmul_module

    idle: dict[str, int] = {}
    for path, sub in cut.named_modules():
        if path and is_matmul_module(sub) and not traced.get(path):
            part = ".".join(path.split(".")[:2])
            idle[part] = idle.get(part, 0) + 1
    return ", ".join(f"{part} ({count:,})" for part, count in sorted(idle.items(), key=lambda kv: -kv[1])[:6])


def check_generation(module: Any) -> EngineCheck:
    """Hold the analytic generate() count (flops/generation.py) against FlopCounterMode's on a cut of `module`: a
    prefill and two decode steps at each check point, the long one ending at the model's context."""
    cut, depth, count = check_cut(module)
    points = check_points(module)
    if len(points) > 2 and _recurrent_without_windows(module):
        # transformers' torch scan runs a Python step a token (seconds a thousand, even on fake tensors), and with no
        # window a step's FLOPs are affine in its keys: the two short points tell the line
        points = points[:2]
    if len(points) > 2:  # two decode steps past the long prompt stay inside the context
        points[-1] = (points[-1][0], max(points[-1][1] - 2, 2))
    return run_check("generation", module, lambda: _generation_difference(cut, points),
                     doing="the analytic generate() count against FlopCounterMode", depth=depth, count=count,
                     points=points, modes=("prefill", "decode steps"))


def _recurrent_without_windows(module: Any) -> bool:
    from ..dims import text_config
    from ..memory.kv import layer_kinds
    from .recurrent_decode import RECURRENT_KINDS

    kinds = layer_kinds(text_config(module.config))
    return any(kind in RECURRENT_KINDS for kind, _ in kinds) and not any(window for _, window in kinds)


def _generation_difference(cut: Any, points: list[tuple[int, int]]) -> str:
    """Where the analytic generate() count of `cut` first differs from FlopCounterMode's, in words; "" never."""
    from ...api import inspect_module
    from ..model_view import from_module
    from ..traced.flops import count_generation
    from .generation import analytic_generation

    params, view = inspect_module(cut).params, from_module(cut)
    for batch, seq in points:
        analytic = analytic_generation(view, params, batch=batch, seq=seq, new_tokens=3)
        if analytic is None:
            return f"at B={batch}, S={seq:,}: the analytic engine gives no generate() count"
        traced = count_generation(cut, batch, seq, 2)
        pairs = [("the prefill", analytic.prefill, traced.prefill),
                 ("decode step 1", analytic.first_step, traced.steps[0]),
                 ("decode step 2", analytic.last_step, traced.steps[1])]
        found = [f"{name} {a:,} analytic vs {t:,} traced" for name, a, t in pairs if a != t]
        if found:
            return f"at B={batch}, S={seq:,}: " + "; ".join(found)
    return ""


def record_check(module: Any, key: str, directory: Path | None = None) -> EngineCheck:
    """The FLOP check kept for `key` (in `directory`, a templates root; None: the package's, else the user
    cache's), or one made on `module` and kept: recorded with a config's cost facts (facts/record.py)."""
    return kept_or_made("flops", module, key, check_flops, directory)


def find_flop_check(class_name: str, key: str) -> EngineCheck | None:
    return find_check("flops", class_name, key)


__all__ = ["check_flops", "check_generation", "find_flop_check", "record_check"]
