"""Where --trace can trace a training step under a layout, told before the build (issue 28: a pipeline of Llama
built and answered for 22 s, then "--trace: no rank traced").

device_trace.py traces rank 0's step (pp 1) or each pipeline stage of a class whose stages are replayed from a
derived step; these functions say, from the layout and the config alone, where it cannot, in the words it would
use, so the CLI and TrainingOptions refuse up front. They refuse only what device_trace.py declines whatever the
class (`untraced_by_layout`), and a pipeline's stages only where the class's closed form surely answers them
(`untraced_pipeline`): where that is uncertain the build goes ahead and device_trace.py says what it did."""

from __future__ import annotations

from typing import Any

from .layout import ParallelLayout


def untraced_by_layout(layout: ParallelLayout) -> str | None:
    """Why --trace traces no rank under `layout`, for any class, or None (device_trace.traced_check's and
    traced_stages' refusals that read the layout alone)."""
    if layout.trivial:
        return None
    if layout.pp > 1:
        if layout.virtual_stages > 1:
            return "an interleaved stage's chunks are bounded by the largest, not traced"
        if layout.cp > 1:
            return "a pipeline beside context parallelism has no traced stage"
        return None  # the stages of a class replayed from its derived step are traced: the class decides
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    if layout.cp > 1 and (layout.ep > 1 or fsdp and layout.shard_degree % layout.cp):
        return "context parallelism is traced beside tp, sp and FSDP2 over dp × cp ranks, not beside ep"
    if layout.ep > 1 and (layout.tp > 1 and fsdp or layout.dp != layout.ep or
                          layout.shard_degree > 1 and layout.shard != "fsdp"):
        return ("expert parallelism is traced over every data-parallel rank (ep equal to dp), beside tensor "
                "parallel on the (ep, tp) mesh or FSDP2's full sharding, not both, nor DeepSpeed's ZeRO or hybrid "
                "sharding")
    if layout.shard in ("zero1", "zero2", "zero3"):
        return "DeepSpeed's ZeRO is not traced (no DeepSpeed here); FSDP2 (zero fsdp) is"
    return None


def untraced_pipeline(config_dict: dict[str, Any], options: Any, *, model_class: str | None = None,
                      task: str | None = None) -> str | None:
    """Why --trace traces no stage of this pipeline (TrainingOptions `options`, layout pp > 1), or None: a class
    whose stages the Llama-style closed form answers at this step (its recipe covers the class, the attention and
    the regime) has no traced engine under a pipeline; a class whose stages are replayed from a derived step has.
    None wherever the config cannot say so surely without the build (the build then answers)."""
    from ...build import choose_class, make_config
    from ...errors import ParamscopeError
    from ..dims import text_config
    from ..memory.activations import recipe_attention, recipe_declines, recipe_peak_inside_layers
    from ..memory.training import DEFAULT_TRAINING_SEQ
    from ..memory.serving import max_context
    from ..memory.training import check_precision
    from .activations import local_recipe

    if options.media is not None or options.freeze or options.own_dtype:
        return None
    try:
        config, _ = make_config(config_dict, model_class=model_class)
        class_name = choose_class(config, config_dict, model_class=model_class, task=task).name
    except ParamscopeError:
        return None
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
    return (f"pipeline parallelism over {class_name} has no traced engine: its stages are answered by the closed "
            f"form ({recipe} recipe), checked against torch's schedules in tests; --trace traces the stages of a "
            "class whose step is derived from traces")
