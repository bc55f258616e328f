"""Structure templates: the whole report of a class, evaluated from a config without torch or transformers.

A template is what a meta build of one class shows, with every size as a polynomial in the config's fields:

- `spec`: a FormulaSpec (formula_spec.py) whose families are the parameters (name pattern → multiplicity and
  shape) and whose conditions are every assumption under which the *whole skeleton* stays the same, not only the
  parameter count: class names, buffers, ties, which runs of layers a stack holds. A config that breaks one is
  not answered from the template (the build answers, and the report says why);
- `buffers` and `runs`: families of the same kind for the buffers' shapes and for the length of each run of
  identical blocks in a stack (T5's encoder: block 0 with the relative bias, then N − 1 blocks without);
- `skeleton`: the module tree with no size in it: each module's class, its parameters and buffers (dtype,
  trainable, persistent, tied to which canonical name), its children, and for a stack its runs.

Evaluating it builds stand-in modules with the right class names and shapes (no tensors, no torch) and passes them
through the very counting, roles, MoE, conventions and report code a meta build goes through, so every number of the
report comes from the same code path as the build's. template_record.py derives templates (that needs torch) and
checks each one against the build's report at every config it probed before it is kept.

Templates are kept in the disk cache as formulas are (disk_cache.py: atomic writes, bounded reads, every field
checked) under <cache>/paramscope-<version>/templates/v<FORMAT>/<transformers version>/<class>/<key>.json, and shipped
in the package for every preset's class (presets/templates/), so a fresh install answers presets at once. The
package's own templates and routes are read first: an entry in the user's cache answers only what the package does
not.
"""

from __future__ import annotations

import copy
import functools
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .disk_cache import (bound_root, class_directory, entry_path, expect, installed_transformers_version, read_entries,
                         read_route, roles_fingerprint, route_file, route_key, safe_name, versioned_directory,
                         write_entry)
from .errors import TemplateError
from .formula_spec import ABSENT, AssumptionError, Family, FormulaSpec, read_path, set_path

FORMAT = 1
MAX_SKELETON_DEPTH = 64
MAX_SKELETON_NODES = 20_000  # stand-in modules one evaluation may create (a 1,024-layer stack of 15 modules each)
SHIPPED = Path(__file__).parent / "presets" / "templates"


@dataclass(frozen=True)
class Template:
    spec: FormulaSpec  # parameters, conditions, symbols, defaults, aliases
    buffers: tuple[Family, ...]  # pattern → buffer shape
    runs: tuple[Family, ...]  # "<stack pattern>#<run index>" → the run's length (its multiplicity)
    skeleton: dict[str, Any]
    class_reason: str  # why the build chose this class, for the route the template was recorded under
    base_model_prefix: str | None
    sub_configs: tuple[str, ...]  # top-level keys holding a dict at the anchor: a config must hold the same ones
    # the config class's field → the JSON kinds its annotation admits ("int", "float", "str", "bool", "null",
    # "list", "dict"): transformers refuses a config whose field has another kind, and so must the template
    field_types: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    format: int = FORMAT

    @property
    def class_name(self) -> str:
        return self.spec.class_name

    def key(self) -> str:
        return self.spec.key()

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "spec": self.spec.to_json(), "buffers": [f.to_json() for f in self.buffers],
                "runs": [f.to_json() for f in self.runs], "skeleton": self.skeleton,
                "class_reason": self.class_reason, "base_model_prefix": self.base_model_prefix,
                "sub_configs": list(self.sub_configs),
                "field_types": {name: list(kinds) for name, kinds in self.field_types.items()}}

    @classmethod
    def from_json(cls, data: Any) -> "Template":
        """The template `to_json` wrote; CacheEntryError names what is wrong with anything else."""
        expect(isinstance(data, dict) and data.get("format") == FORMAT, f"the entry is not of template format "
                                                                          f"{FORMAT}")
        spec = FormulaSpec.from_json(data.get("spec"))
        symbols = [*spec.symbols, *spec.derived]
        for name in ("buffers", "runs"):
            expect(isinstance(data.get(name), list), f"{name} is not a list")
        expect(isinstance(data.get("class_reason"), str), "class_reason is not a string")
        prefix = data.get("base_model_prefix")
        expect(prefix is None or isinstance(prefix, str), "base_model_prefix is not a string")
        subs = data.get("sub_configs")
        expect(isinstance(subs, list) and all(isinstance(s, str) for s in subs), "sub_configs is not a list")
        _check_skeleton(data.get("skeleton"))
        types = data.get("field_types")
        expect(isinstance(types, dict) and all(
            isinstance(name, str) and isinstance(kinds, list) and all(k in JSON_KINDS for k in kinds)
            for name, kinds in types.items()), "field_types is not a mapping of fields to JSON kinds")
        return cls(spec, tuple(Family.from_json(f, symbols) for f in data["buffers"]),
                   tuple(Family.from_json(f, symbols) for f in data["runs"]), data["skeleton"],
                   data["class_reason"], prefix, tuple(subs), {name: tuple(k) for name, k in types.items()})

    @functools.cached_property
    def _shapes(self) -> dict[str, Family]:
        return {f.pattern: f for f in self.spec.families}

    @functools.cached_property
    def _buffer_shapes(self) -> dict[str, Family]:
        return {f.pattern: f for f in self.buffers}

    @functools.cached_property
    def _run_lengths(self) -> dict[str, Family]:
        return {f.pattern: f for f in self.runs}

    # --- evaluation --------------------------------------------------------------------------------------------

    def problem(self, config: dict[str, Any], num_labels: int | None = None) -> str | None:
        """Why this template does not answer `config`, or None when it does."""
        problems = self.spec.violations(config, num_labels)
        if problems:
            return problems[0]
        for name, value in config.items():
            kinds = self.field_types.get(name)
            if kinds and json_kind(value) not in kinds:
                return f"{name} is {json_kind(value)}; {self.class_name}'s config class expects {' or '.join(kinds)}"
        subs = sub_configs_of(config)
        if subs != self.sub_configs:
            return (f"the template was recorded from a config holding the sub-configs {list(self.sub_configs)}, "
                    f"this one holds {list(subs)}")
        return None

    def module(self, config: dict[str, Any], num_labels: int | None = None) -> "StubModule":
        """Stand-in modules for `config`: the skeleton with every size evaluated. AssumptionError when the
        template does not apply."""
        problem = self.problem(config, num_labels)
        if problem:
            raise AssumptionError(problem)
        values = self.spec._values(config, num_labels)
        return _Instantiate(self, values).root()

    def config_view(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` with every integer field it leaves out set to the class default: what the MoE summary and the
        shared-layer finder read from the config object a build makes."""
        view = copy.deepcopy(config)
        for path, default in self.spec.defaults.items():
            if read_path(view, path, self.spec.aliases) is ABSENT:
                set_path(view, path, default)
        return view


JSON_KINDS = ("int", "float", "str", "bool", "null", "list", "dict")


def json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", type(None): "null", list: "list", dict: "dict"}.get(
        type(value), "other")


def sub_configs_of(config: dict[str, Any]) -> tuple[str, ...]:
    """The sub-configs a config gives (text_config, vision_config, …): a flat config and a nested one of the same
    class read their fields from different places, so a template answers only the layout it was recorded from."""
    return tuple(sorted(k for k, v in config.items()
                        if isinstance(v, dict) and k.endswith("_config") and k != "quantization_config"))


# ------------------------------------------------------------------------------------------------ stand-ins


class StubModule:
    """What counting reads from an nn.Module (`_modules`, `_parameters`, `_buffers`, the class name), nothing else."""

    paramscope_stub = True  # conventions.exclude_embeddings asks the stand-in, not torch, which are embeddings
    __slots__ = ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set", "is_embedding")

    def __init__(self, is_embedding: bool = False):
        self._modules: dict[str, StubModule] = {}
        self._parameters: dict[str, StubTensor] = {}
        self._buffers: dict[str, StubTensor] = {}
        self._non_persistent_buffers_set: set[str] = set()
        self.is_embedding = is_embedding

    def named_modules(self):
        """As torch's (remove_duplicate=True): each module once, under its first name, pre-order."""
        seen: set[int] = set()

        def visit(prefix: str, module: StubModule):
            if id(module) in seen:
                return
            seen.add(id(module))
            yield prefix, module
            for attr, child in module._modules.items():
                if child is not None:
                    yield from visit(f"{prefix}.{attr}" if prefix else attr, child)

        yield from visit("", self)

    def named_parameters(self, prefix: str = ""):
        """As torch's (remove_duplicate=True): each tensor once, under its first name, modules in named_modules()'s
        order. torchinfo's convention (reconcile_counts) walks it module by module."""
        seen: set[int] = set()
        for name, module in self.named_modules():
            for local, tensor in module._parameters.items():
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                full = f"{name}.{local}" if name else local
                yield (f"{prefix}.{full}" if prefix else full), tensor

    def children(self):
        return (child for child in self._modules.values() if child is not None)


class StubTensor:
    __slots__ = ("shape", "dtype", "requires_grad", "_numel")

    def __init__(self, shape: tuple[int, ...], dtype: "StubDtype", requires_grad: bool):
        self.shape = shape
        self.dtype = dtype
        self.requires_grad = requires_grad
        numel = 1
        for d in shape:
            numel *= d
        self._numel = numel

    def numel(self) -> int:
        return self._numel


class StubDtype:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


@functools.lru_cache(maxsize=None)
def stub_class(name: str) -> type:
    return type(name, (StubModule,), {"__slots__": ()})


@functools.lru_cache(maxsize=None)
def stub_dtype(name: str) -> StubDtype:
    return StubDtype(name)


def pattern_of(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


class _Instantiate:
    def __init__(self, template: Template, values: dict[str, int]):
        self.t = template
        self.values = values
        # full name → the module or tensor created under it, apart: a tie names a tensor and an alias a module, and a
        # stored name that points at the other kind is refused, never built into a tensor that is a module
        self.modules: dict[str, StubModule] = {}
        self.tensors: dict[str, Any] = {}
        self.nodes = 0
        self._memo: dict[tuple[str, str], Any] = {}

    def _size(self, kind: str, pattern: str) -> Any:
        key = (kind, pattern)
        if key not in self._memo:
            table = {"param": self.t._shapes, "buffer": self.t._buffer_shapes, "run": self.t._run_lengths}[kind]
            family = table.get(pattern)
            if family is None:
                raise AssumptionError(f"the template has no size for {kind} {pattern!r}")
            if kind == "run":
                self._memo[key] = _whole(family.mult.evaluate(self.values), pattern)
            else:
                self._memo[key] = tuple(_whole(d.evaluate(self.values), pattern) for d in family.shape)
        return self._memo[key]

    def root(self) -> StubModule:
        return self._module(self.t.skeleton, "", 0)

    def _module(self, node: dict[str, Any], path: str, depth: int) -> StubModule:
        self.nodes += 1
        if self.nodes > MAX_SKELETON_NODES:
            raise AssumptionError(f"the config asks for more than {MAX_SKELETON_NODES:,} modules")
        module = stub_class(node["type"])(bool(node.get("emb")))
        self.modules[path] = module
        for local, dtype, trainable, tie in node.get("params", ()):
            full = f"{path}.{local}" if path else local
            module._parameters[local] = self._tensor("param", full, dtype, trainable, tie)
        for local, dtype, persistent, tie in node.get("buffers", ()):
            full = f"{path}.{local}" if path else local
            module._buffers[local] = self._tensor("buffer", full, dtype, True, tie)
            if not persistent:
                module._non_persistent_buffers_set.add(local)
        if "runs" in node:
            index = 0
            pattern = pattern_of(path)
            for j, child in node["runs"]:
                for _ in range(self._size("run", f"{pattern}#{j}")):
                    name = f"{path}.{index}" if path else str(index)
                    module._modules[str(index)] = self._module(child, name, depth + 1)
                    index += 1
        for attr, child in node.get("children", ()):
            name = f"{path}.{attr}" if path else attr
            if "alias" in child:
                target = self.modules.get(child["alias"])
                if target is None:
                    raise AssumptionError(f"the template's alias {child['alias']!r} names no module")
                module._modules[attr] = target
            else:
                module._modules[attr] = self._module(child, name, depth + 1)
        return module

    def _tensor(self, kind: str, full: str, dtype: str, trainable: bool, tie: str | None) -> Any:
        if tie is not None:
            target = self.tensors.get(tie)
            if target is None:
                raise AssumptionError(f"the template ties {full!r} to {tie!r}, which it does not hold")
            return target
        tensor = StubTensor(self._size(kind, pattern_of(full)), stub_dtype(dtype), trainable)
        self.tensors[full] = tensor
        return tensor


def _whole(value: Any, pattern: str) -> int:
    if value.denominator != 1 or value < 0:
        raise AssumptionError(f"{pattern}: a size would be {value} at this config, not a whole number")
    return int(value)


def _check_skeleton(node: Any, depth: int = 0, counter: list[int] | None = None) -> None:
    """Type-check a stored skeleton before anything is built from it."""
    counter = counter if counter is not None else [0]
    counter[0] += 1
    expect(counter[0] <= MAX_SKELETON_NODES and depth <= MAX_SKELETON_DEPTH, "the skeleton is too large")
    expect(isinstance(node, dict) and isinstance(node.get("type"), str), "a skeleton node has no class name")
    expect(set(node) <= {"type", "emb", "params", "buffers", "children", "runs"}, "a skeleton node has unknown keys")
    expect(isinstance(node.get("emb", False), bool), "a skeleton node's embedding mark is not a boolean")
    for name in ("params", "buffers", "children", "runs"):
        expect(isinstance(node.get(name, []), list), f"a skeleton node's {name} is not a list")
    for name in ("params", "buffers"):
        for item in node.get(name, ()):
            expect(isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                   and isinstance(item[1], str) and isinstance(item[2], bool)
                   and (item[3] is None or isinstance(item[3], str)), f"a skeleton's {name} entry is malformed")
    for item in node.get("children", ()):
        expect(isinstance(item, list) and len(item) == 2, "a skeleton child is malformed")
        attr, child = item
        expect(isinstance(attr, str) and isinstance(child, dict), "a skeleton child is malformed")
        if "alias" in child:
            expect(set(child) == {"alias"} and isinstance(child["alias"], str), "a skeleton alias is not a path")
        else:
            _check_skeleton(child, depth + 1, counter)
    for item in node.get("runs", ()):
        expect(isinstance(item, list) and len(item) == 2 and type(item[0]) is int, "a skeleton run is malformed")
        _check_skeleton(item[1], depth + 1, counter)


# ---------------------------------------------------------------------------------------------------- the cache


def template_directory(root: Path, version: str) -> Path:
    """Where templates recorded with transformers `version` live under `root` (the cache's or the package's)."""
    return versioned_directory(root, FORMAT, version)


def shipped_directory(version: str) -> Path:
    return template_directory(SHIPPED, version)


def cache_directory(version: str) -> Path:
    """Where the user's cache keeps templates this paramscope version recorded with transformers `version`."""
    return template_directory(bound_root() / "templates", version)


def store_template(template: Template, route: str | None) -> Path | None:
    """Keep `template` in the cache; its path, or None when the cache cannot be written."""
    return write_template(template, route, cache_directory(template.spec.transformers_version))


def write_template(template: Template, route: str | None, directory: Path) -> Path | None:
    record = {"route": route, "class": template.class_name, "reason": template.class_reason}
    return write_entry(entry_path(directory, template.class_name, template.key()), template.to_json(),
                       route=(route_file(directory, route), record) if route else None)


def _adopted_words(template: Template) -> str | None:
    """For a template adopted from another transformers version's (template_adopt.py), where it came from."""
    donor = template.spec.anchor.get("adopted_from")
    if not isinstance(donor, str):
        return None
    return (f"the template shipped for transformers {donor[:20]}, kept for {template.spec.transformers_version[:20]} "
            "after it equalled this version's builds at a config and at its anchor")


@dataclass(frozen=True)
class TemplateLookup:
    template: Template | None
    path: Path | None = None
    class_name: str | None = None
    class_reason: str | None = None
    why_not: str | None = None  # why no template answered, in words (the report's engine line)


def lookup_template(config: dict[str, Any], *, model_class: str | None = None, task: str | None = None,
                    num_labels: int | None = None, directories: list[Path] | None = None,
                    version: str | None = None) -> TemplateLookup:
    """The shipped or cached template that answers `config` (or the first of `directories` that holds one);
    never imports torch or transformers. The package's own templates and routes are read before the user's cache,
    so a cache entry never overrides them. `version`: the transformers version it must have been recorded with (the
    installed one unless given: template_adopt.py reads another version's shipped templates this way)."""
    version = version or installed_transformers_version()
    model_type = config.get("model_type")
    if version is None or not isinstance(model_type, str):
        return TemplateLookup(None, why_not="transformers is not installed" if version is None else None)
    # auto_map (remote code) beside a native model_type is ignored by the build too; templates are only ever
    # recorded for transformers' own classes, and each is checked against the config's model_type below
    route = route_key(config, model_class=model_class, task=task)
    roots = directories or [shipped_directory(version), cache_directory(version)]
    class_name, reason = model_class, (f"--class {model_class}" if model_class else None)
    if class_name is None:
        for root in roots:
            entry = read_route(root, route, ("class", "reason"))
            if entry is not None:
                class_name, reason = entry["class"], entry["reason"]
                break
        if class_name is None:
            return TemplateLookup(None, why_not=f"no template yet for {_route_words(route)}{_other_versions(version)}")
    fingerprint = roles_fingerprint()
    rejected: list[str] = []
    for root in roots:
        for entry, template, why_not in read_entries(class_directory(root, class_name), Template.from_json):
            if template is None:
                rejected.append(f"template {entry.name} {why_not}")
                continue
            spec = template.spec
            if (spec.roles_fingerprint != fingerprint or spec.class_name != class_name
                    or spec.transformers_version != version or entry.stem != template.key()
                    or spec.anchor_problem() is not None):
                continue
            problem = template.problem(config, num_labels)
            if problem:
                rejected.append(problem)
                continue
            return TemplateLookup(template, entry, class_name, reason)
    why = (f"the template for {class_name} does not apply: {rejected[0]}" if rejected
           else f"no template yet for {class_name} under this config's structural settings"
                f"{_other_versions(version)}")
    return TemplateLookup(None, class_name=class_name, why_not=why)


def _other_versions(version: str) -> str:
    """When the package ships templates for other transformers versions only, say so: templates are exact for the
    version they were recorded with and are never used with another."""
    try:
        shipped = sorted(p.name for p in (SHIPPED / f"v{FORMAT}").iterdir() if p.is_dir())
    except OSError:
        return ""
    if not shipped or safe_name(version) in shipped:
        return ""
    return f" (templates ship for transformers {', '.join(shipped)}; this is {version})"


def _route_words(route: str | None) -> str:
    if not route:
        return "this class"
    model_type, how, what = route.split("|", 2)
    if how == "task":
        return f"model_type {model_type!r} with task {what!r}"
    return f"{what or 'model_type ' + repr(model_type)}"


# ---------------------------------------------------------------------------------------------------- the report


def report_from_template(template: Template, source: Any, *, num_labels: int | None = None, class_reason: str,
                         root: StubModule | None = None):
    """The report a meta build of `source` gives, from `template`. AssumptionError when it does not apply.
    `root`: the stand-in modules already made by template.module() for this config (else they are made here)."""
    from .build import config_notes, extra_config_notes
    from .conventions import named_counts
    from .count import count_module
    from .moe import summarize_moe
    from .quant import describe_storage
    from .report import ModelInfo, make_report
    from .sharing import find_shared_layers

    config = source.config
    if num_labels is not None:
        config = {k: v for k, v in config.items() if k not in ("id2label", "label2id")} | {"num_labels": num_labels}
    if root is None:
        root = template.module(source.config, num_labels)
    view = template.config_view(config)
    counted = count_module(root)
    info = ModelInfo(
        source=source.description,
        source_kind=source.kind,
        label=source.label,
        class_name=template.class_name,
        class_reason=class_reason,
        model_type=template.spec.model_type,
        native=True,
        transformers_version=template.spec.transformers_version,
        notes=config_notes(source.config, template.spec.transformers_version) + extra_config_notes(source.config),
        storage=describe_storage(source.config),
        engine="template",
        engine_detail=_adopted_words(template),
    )
    return make_report(info, counted, template.base_model_prefix,
                       moe=summarize_moe(counted.parameters, view, counted.counts.total),
                       conventions=named_counts(counted.parameters, counted.tied, counted.counts.total, root),
                       shared_layers=find_shared_layers(counted.tree, view))


__all__ = ["Template", "TemplateLookup", "lookup_template", "report_from_template", "store_template",
           "StubModule", "TemplateError"]
