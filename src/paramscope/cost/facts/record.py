"""Recording cost facts (facts/store.py): read them from a build, check every answer they give against the build's,
keep them. Needs torch; the CLI records after a build answered, `python -m paramscope.template_record` ships the
presets'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...document_diff import comparable, first_difference
from ...disk_cache import class_directory, installed_transformers_version
from .store import (
    BUILD_DTYPES, CostFacts, facts_directory, facts_from_module, facts_key, set_build_dtypes, view_from_facts,
    write_facts,
)
from ..model_view import FactsGap


# --dtype formats whose answers a recording checks (those whose compute dtype is the build's): each family of
# quantiser decisions (linear, matrices, linear+experts, experts) once
_CHECKED_FORMATS = (None, "fp32", "bf16", "fp16", "nf4", "fp8-block", "q4_k", "mxfp4")


def record_facts(source: Any, report: Any, module: Any, *, build_dtype: str | None, model_class: str | None = None,
                 task: str | None = None, num_labels: int | None = None,
                 directory: Path | None = None) -> tuple[CostFacts | None, str]:
    """Record the cost facts of `module` (built on meta in `build_dtype`, None: float32; `report` is its report)
    for `source`'s config, after checking that the facts' answers equal the build's; (facts or None, what
    happened). Needs the class's template (template.py) for the stand-ins; never raises for a config the build
    took."""
    from ...errors import ParamscopeError
    from ...template import cache_directory, lookup_template

    dtype = build_dtype or "float32"
    found = lookup_template(source.config, model_class=model_class, task=task, num_labels=num_labels)
    if found.template is None:
        return None, f"no cost facts recorded: {found.why_not or 'no template applies'}"
    key = facts_key(source.config, model_class=model_class, task=task, num_labels=num_labels)
    try:
        facts = facts_from_module(module, build_dtype=dtype, key=key)
        difference = check_facts(facts, found.template, source, report, module, dtype, num_labels)
    except (FactsGap, ParamscopeError) as err:
        return None, f"no cost facts recorded: {err}"
    if difference:
        return None, f"no cost facts recorded: the facts' answer differs from the build's at {difference}"
    version = facts.transformers_version
    target = facts_directory(class_directory(directory or cache_directory(version), facts.class_name))
    path = write_facts(facts, target)
    from ..flops.check import record_check

    from ..engine_check import kept_or_made
    from ..memory.serving_check import check_serving

    try:  # the analytic FLOP count and serving peak, each checked once against the traced engine
        record_check(module, key, directory)
        if facts.can_generate and not getattr(module.config, "is_encoder_decoder", False):
            from ..flops.check import check_generation

            kept_or_made("generation", module, key, check_generation, directory)
        kept_or_made("serving", module, f"{key}-{dtype}", lambda built: check_serving(built, dtype), directory)
    except (OSError, ValueError):  # a cache that cannot be written: the next build checks
        pass
    return facts, (f"cost facts recorded at {path}" if path else "cost facts checked but the cache cannot be written")


def check_facts(facts: CostFacts, template: Any, source: Any, report: Any, module: Any, dtype: str,
                num_labels: int | None) -> str | None:
    """Where the facts' answers (the report in `dtype`, serving memory in each format built in it, training
    memory in each precision whose weights are in it, FLOPs of a forward and of training steps) differ from the
    build's, or None."""
    from ...render.json import report_to_dict
    from ...render.memory import memory_to_dict
    from ...template import report_from_template
    from ..memory.serving import MemoryOptions, serving_estimate, storage_format
    from ..flops.analytic import analytic_flops
    from ..dims import is_mla, text_config
    from ..model_view import from_module
    from ..memory.states import weight_dtype
    from ..memory.training import TrainingOptions, step_estimate

    root = template.module(source.config, num_labels)
    set_build_dtypes(root, facts, dtype)
    answered = report_from_template(template, source, num_labels=num_labels,
                                    class_reason=report.model.class_reason, root=root)
    found = first_difference(comparable(report_to_dict(report)), comparable(report_to_dict(answered)))
    if found:
        return f"the report: {found}"
    built, recorded = from_module(module), view_from_facts(facts, root)
    options = [MemoryOptions(dtype=name, seq=256) for name in _CHECKED_FORMATS]
    options.append(MemoryOptions(kv_layout="grouped", seq=256))
    if is_mla(text_config(module.config)):
        options += [MemoryOptions(kv_layout=layout, seq=256) for layout in ("latent", "expanded")]
    for option in options:
        fmt, origin, not_convert = storage_format(source.config, option)
        if fmt.compute_dtype != dtype:
            continue
        expected = memory_to_dict(serving_estimate(report, built, option, fmt, origin, not_convert))
        got = memory_to_dict(serving_estimate(answered, recorded, option, fmt, origin, not_convert))
        found = first_difference(expected, got)
        if found:
            return f"memory --dtype {option.dtype or '(declared)'}: {found}"
    for precision in ("bf16-mixed", "fp16-mixed", "fp32", "bf16-pure"):
        if weight_dtype(precision) != dtype:
            continue
        for checkpointing in ("none", "full"):
            if checkpointing == "full" and not facts.supports_checkpointing:
                continue  # refused in one line by both, before any figure (ALBERT's class has no checkpointing)
            option = TrainingOptions(seq=256, precision=precision, grad_checkpointing=checkpointing)
            got = step_estimate(answered, recorded, option, live=False)
            if got is None:  # no analytic recipe: the traced step needs the build, facts or not
                break
            expected = step_estimate(report, built, option, live=False)
            found = first_difference(memory_to_dict(expected), memory_to_dict(got))
            if found:
                return f"memory --training --precision {precision} --grad-checkpointing {checkpointing}: {found}"
    for training, checkpointing in ((False, False), (True, False), (True, True)):
        settings = dict(batch=1, seq=128, training=training, checkpointing=checkpointing)
        if analytic_flops(built, report.params, **settings) != analytic_flops(recorded, answered.params, **settings):
            return f"flops (training={training}, checkpointing={checkpointing})"
    return None


def ship_facts(directory: Path, names: list[str] | None = None, *, log=print) -> list[str]:
    """Record the cost facts of presets (all by default) into `directory` (the package's shipped set), built in
    each of BUILD_DTYPES, so `memory` and `flops` answer every preset at once after a fresh install."""
    from ...api import inspect_with_module
    from ...presets import presets_named
    from ...sources import resolve
    from ...template import template_directory

    target = template_directory(directory, installed_transformers_version() or "")
    written = []
    for preset in presets_named(names):
        source = resolve(preset.name)
        for dtype in BUILD_DTYPES:
            report, module = inspect_with_module(source, dtype=None if dtype == "float32" else dtype)
            facts, message = record_facts(source, report, module, build_dtype=dtype, directory=target)
            log(f"{preset.name} ({dtype}): {message}")
            if facts is not None:
                written.append(message)
    return written


__all__ = ["check_facts", "record_facts", "ship_facts"]
