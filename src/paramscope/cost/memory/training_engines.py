"""Which engine answers a training step, and the derived one: the derived step (`derive_step`: from the cache or
derived from the built module; `one_device_derived`), why a config needs the build (`why_built`: no analytic recipe,
or a layout derived from traces), and the moments gradient accumulation's search adds."""

from __future__ import annotations

from typing import Any

from ...selection import match_all
from ..dims import text_config
from ..traced.step import StepSettings
from .activations import recipe_declines, recipe_for, recipe_peak_inside_layers
from .serving import step_length
from .states import check_optimizer, check_precision, step_precision
from .training_options import DEFAULT_TRAINING_SEQ, TrainingOptions


def accumulating_moments(report: Any, trainable: frozenset[str], precision: str, own: frozenset[str], source: str,
                         options: TrainingOptions, accumulating: bool) -> Any:
    """(phases, batch, length) → the phases the largest batch and context are searched over: under gradient
    accumulation on one device, a later micro-step's moments added (grad_accum.later_micro_step); else as given
    (beside a layout accumulation searches nothing: grad_accum.accumulated says so)."""
    if not accumulating or (options.layout is not None and not options.layout.trivial):
        return lambda phases, batch, length: phases
    from .grad_accum import later_micro_step

    return later_micro_step(report, trainable, precision, own, source)


def derive_step(view: Any, options: TrainingOptions, seq: int, limit: int | None, frozen: list[str],
                weights_dtype: str | None, own: frozenset[str], *, live: bool, fresh: bool = False,
                structure: str | None = None) -> tuple[Any, str]:
    """(the derived step, "") for the class's training memory at any batch and length, from the cache or derived
    from the built module; (None, "") when neither (the caller builds); (None, why) where the derivation declines
    (its check failed, or the model has no repeated layers to extend). `fresh`: derived and checked at the asked
    point whatever the cache holds (the depth-extended trace)."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable

    # the derived recipes are activations only: bf16-master's are bf16-pure's (the optimizer step is counted here)
    settings = StepSettings(precision=step_precision(check_precision(options.precision)),
                            optimizer=check_optimizer(options.optimizer),
                            grad_checkpointing=options.grad_checkpointing == "full", attention=options.attention,
                            frozen=frozenset(frozen), weights_dtype=weights_dtype, own_dtype=own)
    try:
        step = DerivedStep.first(view.module, view.class_name, view.config, settings, batch=options.batch, seq=seq,
                                 limit=limit, live=live, fresh=fresh, structure=structure)
    except NotDerivable as err:
        return None, str(err)
    return step, ""


def one_device_derived(report: Any, view: Any, options: TrainingOptions) -> Any:
    """The derived step (derived/step.py's DerivedStep) step_estimate answers one device's step of `options` from,
    for the class as its config builds it: read from the cache, or derived where the view has the module; None where
    neither, or where the derivation declines."""
    seq, limit, _ = step_length(report, text_config(view.config), options.seq, DEFAULT_TRAINING_SEQ)
    step, _ = derive_step(view, options, seq, limit, match_all(report.params, options.freeze), None,
                          frozenset(), live=False)
    return step


def why_built(view: Any, options: TrainingOptions) -> str:
    if options.layout is not None and not options.layout.trivial:
        return ("one device's step under the layout is derived from traces of the real class on torch's fake process "
                "group (kept afterwards): it needs the build")
    return f"{_why_traced(view, options)}: the traced step needs the build"


def _why_traced(view: Any, options: TrainingOptions) -> str:
    recipe = recipe_for(text_config(view.config), view.class_name)
    if recipe is None:
        return f"no analytic activation recipe for {view.class_name}"
    why = recipe_declines(text_config(view.config), view.class_name, batch=options.batch,
                          seq=options.seq or DEFAULT_TRAINING_SEQ,
                          precision=step_precision(check_precision(options.precision)),
                          checkpointing=options.grad_checkpointing == "full")
    if why is not None:
        return f"the analytic {recipe} recipe was not fitted for {why}"
    inside = recipe_peak_inside_layers(recipe)
    if inside:
        return f"the analytic {recipe} recipe's moments do not hold its step's peak ({inside})"
    return f"the analytic {recipe} recipe is not for --attention {options.attention}" if options.attention else \
        f"the analytic {recipe} recipe does not cover this config"
