"""The one entry point: anything that names a model → Report.

input → sources (config dict) → build (class choice, meta build) → count (ids, roles, tree) → Report.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import progress
from .conventions import named_counts
from .count import count_module
from .entry_options import MODEL_OPTIONS, check_layout_option, check_model_options  # noqa: F401 (the API's)
from .errors import ModelClassError, OptionError
from .moe import summarize_moe
from .quant import describe_storage
from .report import ModelInfo, Report, make_report
from .sharing import find_shared_layers
from .sources import Source, resolve


def inspect(
    model: Any,
    *,
    model_class: str | None = None,
    task: str | None = None,
    num_labels: int | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    use_cache: bool = True,
) -> Report:
    """Count `model`'s parameters exactly, without weights.

    `model` may be a preset name, a config.json path, a model directory, a hub id, a dict holding a
    config, a transformers `PretrainedConfig`, a `sources.Source` already resolved, or a live
    `torch.nn.Module` (counted as it is).

    With `use_cache`, a config of a class seen before is answered from its structure template (template.py: the
    same report, without importing torch or transformers); otherwise, or when no template applies, the class is
    built on the meta device. `report.model.engine` says which answered.
    """
    if is_module(model):
        return inspect_with_module(model, model_class=model_class, task=task, num_labels=num_labels)[0]
    return inspect_source(as_source(model, revision), model_class=model_class, task=task, num_labels=num_labels,
                          trust_remote_code=trust_remote_code, use_cache=use_cache)[0]


def inspect_source(source: Source, *, model_class: str | None = None, task: str | None = None,
                   num_labels: int | None = None, trust_remote_code: bool = False,
                   use_cache: bool = True) -> tuple[Report, Any]:
    """(Report, what was counted): from a template where one applies (with `use_cache`, never for remote code), with
    the template's stand-in modules (no torch); else from the meta build, with the module, and the report says why
    no template answered. Either serves what walks a module's structure (torchinfo's count, exclude_embeddings, an
    audit); only the built module can run (traces, FLOPs)."""
    why = None
    if use_cache and not trust_remote_code:
        report, root, why = template_answer(source, model_class=model_class, task=task, num_labels=num_labels)
        if report is not None:
            return report, root
    report, module = build_source(source, model_class, task, num_labels, trust_remote_code)
    if why is not None:
        report = replace(report, model=replace(report.model, engine_detail=why))
    return report, module


def template_answer(source: Source, *, model_class: str | None, task: str | None,
                     num_labels: int | None) -> tuple[Report | None, Any, str | None]:
    """(report, the stand-in modules, None), or (None, None, why no template answered)."""
    from .errors import AssumptionError
    from .template import report_from_template

    template, reason, root, why = template_stand_ins(source, model_class=model_class, task=task,
                                                     num_labels=num_labels)
    if template is None:
        return None, None, why
    try:
        report = report_from_template(template, source, num_labels=num_labels, class_reason=reason, root=root)
        return report, root, None
    except AssumptionError as err:
        return None, None, f"the template for {template.class_name} does not apply: {err}"


def template_stand_ins(source: Source, *, model_class: str | None, task: str | None,
                       num_labels: int | None) -> tuple[Any, str | None, Any, str | None]:
    """(template, why its class, its stand-in modules for this config, None), or (None, None, None, why no
    template applies). Torch-free."""
    from .build import TASKS, check_num_labels, resolve_task, validate_config_dict
    from .errors import AssumptionError
    from .template import lookup_template

    if model_class and task:
        raise ModelClassError("give {0} or {1}, not both", "model_class", "task")
    if not isinstance(source.config.get("model_type"), str):
        return None, None, None, None  # the build names what is missing
    validate_config_dict(source.config)
    check_num_labels(num_labels)
    if task:
        key = resolve_task(task)
    found = lookup_template(source.config, model_class=model_class, task=task, num_labels=num_labels)
    if found.template is None:
        return None, None, None, found.why_not
    if task:
        reason = f"--task {task}" + (f" (= {key})" if key != task else "") + f": {TASKS[key][1]}"
    else:
        reason = found.class_reason
    try:
        root = found.template.module(source.config, num_labels)
    except AssumptionError as err:  # sizes the template cannot lay out (too many modules): the build decides
        return None, None, None, f"the template for {found.class_name} does not apply: {err}"
    return found.template, reason, root, None


def inspect_with_module(model: Any, *, model_class: str | None = None, task: str | None = None,
                        num_labels: int | None = None, trust_remote_code: bool = False,
                        revision: str | None = None, dtype: str | None = None) -> tuple[Report, Any]:
    """`inspect`, and the meta-device module it counted (for what needs the module: torchinfo's convention).

    `dtype` ("bfloat16") builds as loading in that dtype would, so each tensor's dtype is the loaded one."""
    if is_module(model):
        if model_class or task or num_labels is not None:
            raise ModelClassError("{0}, {1} and {2} apply to configs, not to a live module", "model_class", "task",
                                  "num_labels")
        return inspect_module(model), model
    return build_source(as_source(model, revision), model_class, task, num_labels, trust_remote_code, dtype)


def as_source(model: Any, revision: str | None = None) -> Source:
    """A config-bearing input as a Source: a Source, a config dict, a PretrainedConfig, or a name `resolve` takes."""
    if isinstance(model, Source):
        return model
    if isinstance(model, dict):
        return Source("config-dict", "config", "a config dict", model)
    if _is_pretrained_config(model):
        return Source("config-object", type(model).__name__, f"a {type(model).__name__} object", model.to_dict())
    if is_module(model):
        raise ModelClassError("a live module has no config to read")
    return resolve(str(model), revision=revision)


def inspect_module(module: Any, *, label: str | None = None) -> Report:
    """Count a live module as it is: its requires_grad flags, ties and buffers."""
    config = getattr(module, "config", None)
    counted = count_module(module)
    info = ModelInfo(
        source=f"a live {type(module).__name__} module",
        source_kind="module",
        label=label or type(module).__name__,
        class_name=type(module).__name__,
        class_reason="the module passed in",
        model_type=getattr(config, "model_type", None),
        native=None,
        transformers_version=None,
        engine="module",
    )
    return make_report(info, counted, getattr(module, "base_model_prefix", None),
                       **_extras(module, config, counted))


def build_source(source: Source, model_class, task, num_labels, trust_remote_code,
                 dtype: str | None = None) -> tuple[Report, Any]:
    """(Report, module) of `source` built on meta (in `dtype`), the class chosen as transformers would: no template."""
    from .build import build_on_meta, choose_class, extra_config_notes, make_config, transformers_version

    location = code_location(source)
    # a copy: transformers normalises some fields in place (rope_scaling), and the source's config must stay as
    # given (cost facts are keyed by it)
    config, notes = make_config(copy.deepcopy(source.config), num_labels=num_labels, trust_remote_code=trust_remote_code,
                                code_location=location, model_class=model_class)
    choice = choose_class(config, source.config, model_class=model_class, task=task,
                          remote_code=trust_remote_code and location is not None)
    with progress.status(f"building {choice.name} on the meta device (no weights are allocated)"):
        module = build_on_meta(choice.name, copy.deepcopy(config), code_ref=choice.code_ref,
                               code_location=location, dtype=dtype)
    native = type(module).__module__.startswith("transformers.")
    info = ModelInfo(
        source=source.description,
        source_kind=source.kind,
        label=source.label,
        class_name=type(module).__name__,
        class_reason=choice.reason,
        model_type=config.model_type,
        native=native,
        transformers_version=transformers_version(),
        notes=tuple(notes) + extra_config_notes(source.config),
        storage=describe_storage(source.config),
    )
    counted = count_module(module)
    report = make_report(info, counted, getattr(module, "base_model_prefix", None),
                         **_extras(module, config, counted))
    return report, module


def code_location(source: Source) -> str | None:
    """Where a remote-code config's auto_map modules are: the given file's own folder, or its hub repo."""
    if source.kind in ("hub", "hub-cache"):
        return source.label
    if source.path is not None:
        return str(Path(source.path).resolve().parent)
    return None


def _extras(module: Any, config: Any, counted) -> dict[str, Any]:
    """What needs more than the counted tensors: the config (MoE E and k, ALBERT's groups) or the module."""
    return {
        "moe": summarize_moe(counted.parameters, config, counted.counts.total),
        "conventions": named_counts(counted.parameters, counted.tied, counted.counts.total, module),
        "shared_layers": find_shared_layers(counted.tree, config),
    }


def is_module(obj: Any) -> bool:
    # Checked by duck type first so that a plain string never triggers `import torch`.
    if isinstance(obj, (str, dict)) or not hasattr(obj, "named_parameters"):
        return False
    import torch

    return isinstance(obj, torch.nn.Module)


def _is_pretrained_config(obj: Any) -> bool:
    return hasattr(obj, "to_dict") and hasattr(obj, "model_type") and type(obj).__name__.endswith("Config")
