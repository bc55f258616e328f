"""Whether --trace can trace a pipeline's stages, told from the config before the build: a class whose stages the
Llama-style closed form answers is traced only where the closed form is held to its stages' traces
(trace_reach.closed_form_traced; device_trace.traced_closed_form_stages) (trace_reach.py has the layouts no trace takes
whatever the model; this one reads the config, so it sits apart from what TrainingOptions imports)."""

from __future__ import annotations

from typing import Any

from .trace_reach import CLOSED_FORM_TRACED, closed_form_traced


def untraced_pipeline(config: Any, options: Any, *, model_class: str | None = None, task: str | None = None,
                      class_name: str | None = None) -> str | None:
    """Why --trace traces no stage of this pipeline (TrainingOptions `options`, layout pp > 1), or None: a class
    whose stages the Llama-style closed form answers at this step (its recipe covers the class, the attention and
    the regime) has no traced engine under a pipeline; a class whose stages are replayed from a derived step has.
    None wherever the config cannot say so surely without the build (the build then answers).
    `config`: the config object of the class `class_name` (the recorded cost facts' view, which imports nothing:
    the CLI's, facts.store.recorded_view), or without `class_name` the config's dict, made into a config and a class
    here (transformers' config and modeling modules imported, seconds that only a build that follows shares)."""
    from ..model_view import FactsGap

    if options.media is not None or options.freeze or options.own_dtype:
        return None
    if class_name is None:
        from ...build import choose_class, make_config  # transformers' modules (a few seconds)
        from ...errors import ParamscopeError

        try:
            config_dict = config
            config, _ = make_config(config_dict, model_class=model_class)
            class_name = choose_class(config, config_dict, model_class=model_class, task=task).name
        except ParamscopeError:
            return None
    try:
        return _closed_form_stages(config, class_name, options)
    except FactsGap:  # a field the recorded facts lack: the build answers
        return None


def _closed_form_stages(config: Any, class_name: str, options: Any) -> str | None:
    """Why the closed form answers `class_name`'s stages at this step (its recipe, attention and regime), or None."""
    from ..dims import text_config
    from ..memory.activations import recipe_attention, recipe_declines, recipe_peak_inside_layers
    from ..memory.serving import max_context
    from ..memory.states import check_precision
    from ..memory.training import DEFAULT_TRAINING_SEQ
    from .activations import local_recipe

    text = text_config(config)
    recipe = local_recipe(text, class_name)
    if recipe is None or recipe_peak_inside_layers(recipe):
        return None
    attention = options.attention or str(getattr(config, "_attn_implementation", "") or "") or "sdpa"
    if recipe_attention(recipe) != ("sdpa" if attention in ("sdpa", "flash") else attention):
        return None
    limit = max_context(text)
    seq = options.seq or min(DEFAULT_TRAINING_SEQ, limit or DEFAULT_TRAINING_SEQ)
    if recipe_declines(text, class_name, batch=options.batch, seq=seq, precision=check_precision(options.precision),
                       checkpointing=options.grad_checkpointing == "full"):
        return None
    if closed_form_traced(options.layout, checkpointing=options.grad_checkpointing == "full") is None:
        return None  # each stage traced beside the closed form (device_trace.traced_closed_form_stages)
    return (f"pipeline parallelism over {class_name} has no traced engine: its stages are answered by the closed "
            f"form ({recipe} recipe), checked against torch's schedules in tests; --trace traces them where the "
            f"closed form is held to each stage's trace ({CLOSED_FORM_TRACED}), and the stages of a class whose step "
            "is derived from traces")
