"""Whether --trace can trace a pipeline's stages, told from the config before the build: a class whose stages the
Llama-style closed form answers is traced only where the closed form is held to its stages' traces
(closed_form_traced; device_trace.traced_closed_form_stages) (trace_reach.py has the layouts no trace takes
whatever the model; this one reads the config, so it sits apart from what TrainingOptions imports)."""

from __future__ import annotations

from typing import Any


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


# where the Llama closed form's stages are held to their traces, so --trace traces them beside it
CLOSED_FORM_TRACED = ("1F1B with more microbatches than stages, without tensor, context or expert parallelism, FSDP "
                      "sharding, interleaving or checkpointing: every stage before the last peaks in its steady state")


def closed_form_traced(layout: Any, *, checkpointing: bool) -> str | None:
    """Why the Llama closed form's stages under `layout` are not held to their traces (its figures there are named
    estimates), or None where they are: 1F1B with more microbatches than stages (every stage before the last in its
    steady state, pipeline_device.mlp_backward_working), one rank a stage (no tp, cp, ep or FSDP sharding), no
    virtual stages, no checkpointing."""
    if layout.schedule != "1f1b" or layout.virtual_stages > 1 or layout.micro_batches <= layout.pp:
        return "outside 1F1B with more microbatches than stages"
    if layout.tp > 1 or layout.cp > 1 or layout.ep > 1 or layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        return "beside tensor, context or expert parallelism or FSDP sharding"
    if checkpointing:
        return "with gradient checkpointing"
    return None
