"""A training step's analytic recipe (training_step.py): the attention it runs, whether an analytic activation recipe
fits the model at it (not a PEFT model's, whose adapters add their own, nor a cross-attention family's traced input),
and why not, in words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .activations import (
    TrainingActivations, recipe_attention, recipe_declines, recipe_for, recipe_peak_inside_layers,
    training_activations,
)
from .training_options import TrainingOptions


@dataclass(frozen=True)
class StepRecipe:
    """`attention` the step's attention implementation (`fused`: sdpa's kernels); `adapters` a PEFT model's;
    `recipe` the analytic recipe's name for the model, or None; `analytic` its activations when it is the answer;
    `beside` its activations when it is shown as a check only (its peak lies inside a layer's moments)."""

    attention: str
    fused: bool
    adapters: bool
    recipe: str | None
    analytic: TrainingActivations | None
    beside: TrainingActivations | None


def step_recipe(view: Any, text: Any, options: TrainingOptions, *, live: bool, seq: int, shape: dict,
                cross: Any, notes: list[str]) -> StepRecipe:
    """The analytic recipe for the step of `options.batch` sequences of `seq` tokens under `shape` (the recipe's
    keywords: precision, checkpointing, casts); `cross` a cross-attention family's input (the answer is the trace's);
    why a recipe is not the answer is added to `notes`."""
    module = view.module
    class_name = view.class_name
    run, checkpointing = shape["precision"], shape["checkpointing"]
    attention = options.attention or str(getattr(view.config, "_attn_implementation", "") or "") or "sdpa"
    # adapters add their own activations: never an analytic recipe's (a plan counted without a build is a PEFT
    # model's stand-ins, named as PEFT's classes are)
    adapters = (module is not None and type(module).__module__.startswith("peft")) or \
        (module is None and live and class_name.startswith("PeftModel"))
    fused = attention in ("sdpa", "flash")  # flash is sdpa's flash kernel here, as traced
    recipe = recipe_for(text, class_name)
    fitted = recipe_attention(recipe) if recipe else None
    at_fitted = fitted == ("sdpa" if fused else attention)
    analytic = training_activations(text, class_name, batch=options.batch, seq=seq, **shape) \
        if at_fitted and not adapters and cross is None else None
    if recipe is not None and cross is None and not at_fitted:  # (a cross-attention step: the trace's, said above)
        notes.append(f"the analytic recipe is for {fitted} attention; attention {attention} is traced")
    elif recipe is not None and cross is None and analytic is None and not adapters:
        why = recipe_declines(text, class_name, batch=options.batch, seq=seq, precision=run,
                              checkpointing=checkpointing)
        notes.append(f"the analytic {recipe} recipe was not fitted for {why}: one step traced")
    beside = None  # a recipe's figures shown as a check, not given as the answer
    inside = recipe_peak_inside_layers(analytic.recipe) if analytic is not None else ""
    if inside:
        beside, analytic = analytic, None
        notes.append(f"the analytic {beside.recipe} recipe counts what the forward saves, but {inside}, which the "
                     "recipe's moments do not hold: the step is derived from traces (the recipe's figure is given "
                     "beside, as a check)")
    return StepRecipe(attention, fused, adapters, recipe, analytic, beside)
