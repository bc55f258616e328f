"""Recording structure templates (template.py): derive one from meta builds, check it, keep it. Needs torch.

The derivation is the formula engine's (derive/), run on a richer snapshot of each build: besides the
parameter families it holds the buffers' shapes, the length of each run of identical blocks in a stack, and the
module skeleton with every size left out. So a field is structural for a template when it changes anything a report
shows (an activation's class name, a buffer), not only when it changes the count; every other field is a size,
fitted as a polynomial exactly as the formula's dimensions are.

Before a template is kept, the report it gives is compared with the build's report, JSON key for key, at every
config the derivation built (up to a cap): the anchor, the single-field variations, the joint variations and the
hold-outs. Any difference and no template is kept.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from .count import count_module
from .derive.derivation import derive_structure
from .derive.probe import Snapshot, snapshot
from .document_diff import comparable, first_difference
from .errors import ParamscopeError
from .disk_cache import route_key
from .template import (Template, TemplateError, pattern_of, report_from_template, store_template, sub_configs_of,
                       write_template)

MAX_CHECKS = 12  # configs at which a new template's report is compared with the build's
DEFAULT_BUDGET_S = 60.0


def skeleton_of(module: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """(skeleton, run lengths): the module tree without sizes, and how many blocks each run of a stack holds
    (keyed `<stack pattern>#<run index>`). TemplateError when one stack pattern holds different runs in
    different places (the template could not say which)."""
    import torch

    modules: dict[int, str] = {}
    tensors: dict[int, str] = {}
    runs: dict[str, int] = {}

    def visit(module: Any, path: str) -> dict[str, Any]:
        modules[id(module)] = path
        node: dict[str, Any] = {"type": type(module).__name__}
        if isinstance(module, torch.nn.Embedding):
            node["emb"] = True
        params = [_entry(tensors, path, local, p, bool(p.requires_grad)) for local, p in module._parameters.items()
                  if p is not None]
        persistent_off = getattr(module, "_non_persistent_buffers_set", set())
        buffers = [_entry(tensors, path, local, b, local not in persistent_off) for local, b in module._buffers.items()
                   if b is not None]
        if params:
            node["params"] = params
        if buffers:
            node["buffers"] = buffers
        children = [(attr, child) for attr, child in module._modules.items() if child is not None]
        if children and [a for a, _ in children] == [str(i) for i in range(len(children))] and not any(
                id(child) in modules for _, child in children):
            nodes = [visit(child, f"{path}.{attr}" if path else attr) for attr, child in children]
            grouped: list[list[Any]] = []
            for child_node in nodes:
                if grouped and grouped[-1][1] == child_node:
                    grouped[-1][2] += 1
                else:
                    grouped.append([len(grouped), child_node, 1])
            node["runs"] = [[j, child_node] for j, child_node, _ in grouped]
            pattern = pattern_of(path)
            for j, _, length in grouped:
                key = f"{pattern}#{j}"
                if runs.setdefault(key, length) != length:
                    raise TemplateError(f"the stacks at {pattern} hold runs of different lengths in different places")
            if sum(1 for key in runs if key.startswith(pattern + "#")) != len(grouped):
                raise TemplateError(f"the stacks at {pattern} hold different runs in different places")
        elif children:
            node["children"] = [
                [attr, {"alias": modules[id(child)]} if id(child) in modules
                 else visit(child, f"{path}.{attr}" if path else attr)]
                for attr, child in children]
        return node

    return visit(module, ""), runs


def _entry(tensors: dict[int, str], path: str, local: str, tensor: Any, flag: bool) -> list[Any]:
    full = f"{path}.{local}" if path else local
    tie = tensors.get(id(tensor))
    if tie is None:
        tensors[id(tensor)] = full
    return [local, str(tensor.dtype).removeprefix("torch."), flag, tie]


def template_snapshot(module: Any) -> Snapshot:
    """The formula engine's snapshot plus what a template needs: buffer shapes, run lengths, the skeleton."""
    counted = count_module(module)
    base = snapshot(counted)
    if any(k for _, _, k in base.fams):
        raise TemplateError("one parameter name pattern holds tensors of different shapes")
    fams = dict(base.fams)
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for buffer in counted.buffers:
        shapes.setdefault(pattern_of(buffer.name), []).append(buffer.shape)
    for pattern, found in shapes.items():
        if len(set(found)) > 1:
            raise TemplateError(f"the buffers {pattern} have different shapes in different places")
        fams[(pattern, "<buffer>", 0)] = (len(found), found[0])
    skeleton, runs = skeleton_of(module)
    for key, length in runs.items():
        fams[(key, "<run>", 0)] = (length, ())
    return Snapshot(fams, base.total, base.breakdown, json.dumps(skeleton, sort_keys=True))


def derive_template(config: dict[str, Any], *, label: str = "config", model_class: str | None = None,
                    task: str | None = None, num_labels: int | None = None,
                    budget_s: float = DEFAULT_BUDGET_S, max_build_s: float | None = None) -> Template:
    """A template for `config`'s class under its structural settings, checked against the build's reports.
    TemplateError (or FormulaError) when none can be made within `budget_s`."""
    started = time.perf_counter()
    derivation = derive_structure(config, label, model_class=model_class, task=task, num_labels=num_labels,
                                  take=template_snapshot, deadline=started + budget_s,
                                  max_anchor_build_s=max_build_s)
    spec, module, extras = derivation.spec, derivation.anchor_module, derivation.extra_families
    skeleton, _ = skeleton_of(module)
    template = Template(
        spec=spec,
        buffers=tuple(f for f in extras if f.role == "<buffer>"),
        runs=tuple(f for f in extras if f.role == "<run>"),
        skeleton=skeleton,
        class_reason=derivation.class_reason,
        base_model_prefix=getattr(module, "base_model_prefix", None) or None,
        sub_configs=sub_configs_of(config),
        field_types=field_kinds(derivation.config_class),
    )
    template = Template.from_json(json.loads(json.dumps(template.to_json())))  # as it will be read back
    anchor_structure = derivation.anchor.structure()
    checked = 0
    for probe in derivation.probes:
        if probe.snapshot.structure() != anchor_structure or checked >= MAX_CHECKS:
            continue
        if template.problem(probe.config, probe.num_labels) is not None:
            continue
        difference = compare_with_build(template, probe.config, model_class=model_class, task=task,
                                        num_labels=probe.num_labels)
        if difference:
            raise TemplateError(f"the template for {spec.class_name} differs from the build: {difference}")
        checked += 1
    if checked == 0:
        raise TemplateError(f"the template for {spec.class_name} could not be checked at any config")
    return template


def field_kinds(config_class: type) -> dict[str, tuple[str, ...]]:
    """The config class's annotated fields → the JSON kinds transformers' strict validation admits for each;
    fields whose annotation says nothing checkable are left out."""
    out = {}
    for klass in reversed(config_class.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            kinds = _kinds(annotation)
            if kinds is None:
                out.pop(name, None)
            else:
                out[name] = tuple(sorted(kinds))
    return out


def _kinds(annotation: Any) -> set[str] | None:
    import types
    import typing

    simple = {int: "int", float: "float", str: "str", bool: "bool", type(None): "null", list: "list",
              tuple: "list", dict: "dict", None: "null"}
    if isinstance(annotation, type) or annotation is None:
        return {simple[annotation]} if annotation in simple else None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found: set[str] = set()
        for arg in typing.get_args(annotation):
            kinds = _kinds(arg)
            if kinds is None:
                return None
            found |= kinds
        return found
    if origin in (list, tuple):
        return {"list"}
    if origin is dict:
        return {"dict"}
    if origin is typing.Literal:
        found = set()
        for value in typing.get_args(annotation):
            kind = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}.get(type(value))
            if kind is None:
                return None
            found.add(kind)
        return found
    return None


def compare_with_build(template: Template, config: dict[str, Any], *, model_class: str | None = None,
                       task: str | None = None, num_labels: int | None = None) -> str | None:
    """Where the template's report of `config` differs from the meta build's (JSON paths), or None."""
    from .api import build_source
    from .render.json import report_to_dict
    from .sources import Source

    source = Source("config-dict", "config", "a config dict", copy.deepcopy(config))
    built, _ = build_source(source, model_class, task, num_labels, False)
    answered = report_from_template(template, source, num_labels=num_labels, class_reason=built.model.class_reason)
    return first_difference(comparable(report_to_dict(built)), comparable(report_to_dict(answered)))


def record_template(config: dict[str, Any], *, label: str = "config", model_class: str | None = None,
                    task: str | None = None, num_labels: int | None = None,
                    budget_s: float = DEFAULT_BUDGET_S, max_build_s: float | None = None
                    ) -> tuple[Template | None, str]:
    """Derive, check and cache a template; (template or None, what happened in words). Never raises for a
    config the build took: a class that no template can express is simply answered by the build next time."""
    try:
        template = derive_template(config, label=label, model_class=model_class, task=task, num_labels=num_labels,
                                   budget_s=budget_s, max_build_s=max_build_s)
    except ParamscopeError as err:
        return None, f"no template recorded: {err}"
    path = store_template(template, route_key(config, model_class=model_class, task=task))
    if path is None:
        return template, "template derived but the cache directory cannot be written"
    return template, f"template recorded at {path}"


def ship_presets(directory, names: list[str] | None = None, *, log=print) -> list[str]:
    """Record templates for presets (all of them by default) into `directory` (the package's shipped set)."""
    from .disk_cache import installed_transformers_version
    from .presets import presets_named
    from .template import lookup_template, template_directory

    version = installed_transformers_version()
    target = template_directory(directory, version)
    presets = presets_named(names)
    written = []
    for preset in presets:
        config = preset.load_config()
        started = time.perf_counter()
        route = route_key(config, model_class=None, task=None)
        covering = lookup_template(config, directories=[target])
        if covering.template is not None:
            log(f"{preset.name}: covered by {covering.class_name}/{covering.path.name}")
            continue
        try:
            template = derive_template(config, label=preset.name, budget_s=600)
        except ParamscopeError as err:
            log(f"{preset.name}: no template ({err})")
            continue
        path = write_template(template, route, target)
        written.append(str(path))
        log(f"{preset.name}: {template.class_name} {template.key()} ({time.perf_counter() - started:.1f} s)")
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m paramscope.template_record [PRESET …]`: regenerate the shipped templates and cost facts for the
    installed transformers version (all presets by default); other versions' stay. Run it after a new transformers release
    or a change of the role rules; tests/test_template.py fails when the installed version's are stale."""
    import shutil
    import sys

    from .disk_cache import installed_transformers_version
    from .template import SHIPPED

    from .template import shipped_directory

    names = list(sys.argv[1:] if argv is None else argv)
    if not names:  # a full regeneration replaces the installed version's files; other versions' stay
        shutil.rmtree(shipped_directory(installed_transformers_version()), ignore_errors=True)
    ship_presets(SHIPPED, names or None)
    from .cost.facts.record import ship_facts

    ship_facts(SHIPPED, names or None)
    print(f"shipped templates for transformers {installed_transformers_version()} in {SHIPPED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
