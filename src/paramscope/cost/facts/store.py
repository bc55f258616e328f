"""Cost facts: what the analytic memory and FLOP engines read of a built model, recorded for one config.

A structure template (template.py) answers the report without torch; memory and FLOPs need a little more
(model_view.ModelView): the config object as the class reads it, which module classes run as one matmul and which
ones transformers' quantisers replace, its default quantisation skips, whether it generates, and, per build dtype,
each tensor's dtype, the names it keeps in fp32 and the bytes its real cache holds after a two-token prefill.

facts/record.py reads them from the module a build made, then answers the engines both ways (the build's view
and the facts' view over the template's stand-ins) and keeps the facts only when every answer is identical. Facts
are kept per exact config (its fields, --class, --task, --num-labels), beside the class's templates:
<templates>/<class>/costs/<key>.json, in the user's cache (recorded after a build) and in the package (every
preset). A config without facts, a dtype the facts were not recorded in, or a read they do not hold
(`FactsGap`) is answered by the build, which records them for next time.

The config is kept as a snapshot of every attribute the config object gives (transformers' defaults and the
fields its __init__ derives included), read back through its attribute_map, so the engines' `getattr` reads see
what they would see on the real object; what cannot be kept as JSON is marked, and reading it is a gap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...disk_cache import (
    CacheEntryError, class_directory, expect, installed_transformers_version, read_entry, roles_fingerprint, safe_name,
    write_entry,
)
from ..dtypes import ITEMSIZE
from ..model_view import FactsGap, ModelView
from .globs import MAX_GLOBS, is_glob

# 2: keep_fp32 is a list of globs paramscope compiles (facts/globs.py), no longer a regular expression (format-1
# facts are never read again: the build answers once and records them afresh)
FORMAT = 2
BUILD_DTYPES = ("float32", "bfloat16", "float16")
MAX_SNAPSHOT_DEPTH = 3
_UNKEPT_FIELDS = frozenset({"_name_or_path", "name_or_path", "transformers_version", "_commit_hash"})


# ------------------------------------------------------------------------------------------------- the config


def config_snapshot(config: Any, depth: int = 0) -> dict[str, Any]:
    """{"fields": {name: JSON value}, "subs": {name: snapshot}, "gaps": [names]} for every public and private
    non-method attribute of a transformers config object (dir(), properties included)."""
    import warnings

    from ...build import quiet_transformers

    fields: dict[str, Any] = {}
    subs: dict[str, Any] = {}
    gaps: list[str] = []
    with quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in dir(config):
            if name.startswith("__"):
                continue
            if name in _UNKEPT_FIELDS:
                gaps.append(name)
                continue
            try:
                value = getattr(config, name)
            except AttributeError:  # absent, as hasattr() says on the real object (GPT-2's rope_scaling property
                continue  # reads a rope_parameters it has none of): the facts' config raises it too
            except Exception:  # broad on purpose: a property runs the config class's own code; unreadable is a gap
                gaps.append(name)
                continue
            if _is_config(value):
                if depth < MAX_SNAPSHOT_DEPTH:
                    subs[name] = config_snapshot(value, depth + 1)
                else:
                    gaps.append(name)
            elif callable(value):
                continue
            elif _keeps_as_json(value):
                fields[name] = _as_json(value)
            else:
                gaps.append(name)
    return {"fields": fields, "subs": subs, "gaps": sorted(gaps)}


def snapshot_of(config: Any) -> dict[str, Any]:
    """The snapshot of a transformers config, or the one a FactsConfig was read back from: the same dict for the
    same config, built or recorded."""
    if isinstance(config, FactsConfig):
        return {"fields": config._fields, "subs": {k: snapshot_of(v) for k, v in config._subs.items()},
                "gaps": sorted(config._gaps)}
    return config_snapshot(config)


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type") and type(value).__name__.endswith("Config")


def _keeps_as_json(value: Any) -> bool:
    """A value that JSON gives back as the engines read it (a tuple comes back a list: they accept both)."""
    try:
        return json.loads(json.dumps(_as_json(value))) == _as_json(value)
    except (TypeError, ValueError, RecursionError):
        return False


def _as_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_as_json(v) for v in value]
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


class FactsConfig:
    """A config object read back from its snapshot: attribute reads as transformers' config gives them."""

    __slots__ = ("_fields", "_subs", "_gaps", "_map", "_text")

    def __init__(self, snapshot: dict[str, Any], text: str | None = None):
        self._fields = snapshot["fields"]
        self._subs = {name: FactsSubConfig(sub) for name, sub in snapshot["subs"].items()}
        self._gaps = frozenset(snapshot["gaps"])
        mapping = self._fields.get("attribute_map")
        self._map = mapping if isinstance(mapping, dict) else {}
        self._text = text

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for key in (name, self._map.get(name)):
            if key is None:
                continue
            if key in self._fields:
                return self._fields[key]
            if key in self._subs:
                return self._subs[key]
            if key in self._gaps:
                raise FactsGap(f"the config's {name} was not recorded")
        raise AttributeError(name)

    def get_text_config(self, decoder: bool = False) -> Any:
        if self._text is None or self._text == "self":
            return self
        return self._subs[self._text]


class FactsSubConfig(FactsConfig):
    """A sub-config (text_config): another type, as transformers' sub-configs are another class."""

    __slots__ = ()


def _text_choice(config: Any) -> str:
    """Which object the engines' text_config() takes: "self", or the attribute holding the sub-config."""
    from ..dims import text_config

    text = text_config(config)
    if text is config:
        return "self"
    for name in dir(config):
        if not name.startswith("__") and name not in _UNKEPT_FIELDS:
            try:
                if getattr(config, name) is text:
                    return name
            except Exception:  # broad on purpose, as in config_snapshot: a property that raises is not the one
                continue
    raise FactsGap("the config's text config is not one of its attributes")


# -------------------------------------------------------------------------------------------------- the facts


@dataclass(frozen=True)
class BuildFacts:
    """What depends on the dtype the class is built in."""

    dtypes: dict[str, str]  # tensor name pattern (layer indices as *) → its dtype in this build
    keep_fp32: tuple[str, ...] | None  # globs (facts/globs.py) of the names transformers keeps in fp32 in this dtype
    probe: int | None  # the real cache's bytes after a 2-token prefill on meta; None: it could not run


@dataclass(frozen=True)
class CostFacts:
    class_name: str
    transformers_version: str
    roles_fingerprint: str
    key: str
    config: dict[str, Any]  # config_snapshot
    text: str
    can_generate: bool
    supports_checkpointing: bool
    matmul_classes: tuple[str, ...]
    linear_classes: tuple[str, ...]
    default_skips: tuple[str, ...]
    builds: dict[str, BuildFacts]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "class": self.class_name, "transformers_version": self.transformers_version,
                "roles_fingerprint": self.roles_fingerprint, "key": self.key, "config": self.config,
                "text": self.text, "can_generate": self.can_generate,
                "supports_checkpointing": self.supports_checkpointing, "matmul_classes": list(self.matmul_classes),
                "linear_classes": list(self.linear_classes), "default_skips": list(self.default_skips),
                "builds": {dtype: {"dtypes": b.dtypes,
                                   "keep_fp32": None if b.keep_fp32 is None else list(b.keep_fp32), "probe": b.probe}
                           for dtype, b in sorted(self.builds.items())}}

    @classmethod
    def from_json(cls, data: Any) -> "CostFacts":
        expect(isinstance(data, dict) and data.get("format") == FORMAT, f"not cost facts of format {FORMAT}")
        for name in ("class", "transformers_version", "roles_fingerprint", "key", "text"):
            expect(isinstance(data.get(name), str), f"{name} is not a string")
        for name in ("can_generate", "supports_checkpointing"):
            expect(isinstance(data.get(name), bool), f"{name} is not a boolean")
        for name in ("matmul_classes", "linear_classes", "default_skips"):
            expect(isinstance(data.get(name), list) and all(isinstance(s, str) for s in data[name]),
                   f"{name} is not a list of names")
        _check_snapshot(data.get("config"), 0)
        expect(data["text"] == "self" or data["text"] in data["config"]["subs"], "text names no sub-config")
        builds = data.get("builds")
        expect(isinstance(builds, dict) and set(builds) <= set(BUILD_DTYPES), "builds is not keyed by dtype")
        parsed = {}
        for dtype, build in builds.items():
            expect(isinstance(build, dict) and set(build) == {"dtypes", "keep_fp32", "probe"}, "a build is malformed")
            dtypes, globs = build["dtypes"], build["keep_fp32"]
            expect(isinstance(dtypes, dict) and all(isinstance(k, str) and isinstance(v, str) and v in ITEMSIZE
                                                    for k, v in dtypes.items()),
                   "a build's dtypes are not element types")
            expect(globs is None or isinstance(globs, list) and 0 < len(globs) <= MAX_GLOBS
                   and all(map(is_glob, globs)),
                   f"keep_fp32 is not a list of at most {MAX_GLOBS} globs (letters, digits, _ - . ? *)")
            expect(build["probe"] is None or type(build["probe"]) is int and build["probe"] >= 0,
                   "probe is not a byte count")
            parsed[dtype] = BuildFacts(build["dtypes"], None if globs is None else tuple(globs), build["probe"])
        return cls(data["class"], data["transformers_version"], data["roles_fingerprint"], data["key"],
                   data["config"], data["text"], data["can_generate"], data["supports_checkpointing"],
                   tuple(data["matmul_classes"]),
                   tuple(data["linear_classes"]), tuple(data["default_skips"]), parsed)


def _check_snapshot(snapshot: Any, depth: int) -> None:
    expect(depth <= MAX_SNAPSHOT_DEPTH and isinstance(snapshot, dict)
            and set(snapshot) == {"fields", "subs", "gaps"}, "the config snapshot is malformed")
    expect(isinstance(snapshot["fields"], dict), "the snapshot's fields are not a mapping")
    expect(isinstance(snapshot["gaps"], list) and all(isinstance(g, str) for g in snapshot["gaps"]),
            "the snapshot's gaps are not names")
    expect(isinstance(snapshot["subs"], dict), "the snapshot's sub-configs are not a mapping")
    for sub in snapshot["subs"].values():
        _check_snapshot(sub, depth + 1)


def facts_key(config: dict[str, Any], *, model_class: str | None, task: str | None,
              num_labels: int | None) -> str:
    """The exact config (less where it came from) and how its class was asked for, hashed."""
    kept = {k: v for k, v in config.items() if k not in _UNKEPT_FIELDS}
    text = json.dumps([kept, model_class, task, num_labels], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def facts_from_module(module: Any, *, build_dtype: str, key: str) -> CostFacts:
    """The facts of a module built on meta in `build_dtype` (FactsGap when its config cannot be kept)."""
    from ...count import count_module
    from ...template import pattern_of
    from ..model_view import from_module

    view = from_module(module)
    config = getattr(module, "config", None)
    counted = count_module(module)
    dtypes: dict[str, str] = {}
    for tensor in (*counted.parameters, *counted.buffers):
        if dtypes.setdefault(pattern_of(tensor.name), tensor.dtype) != tensor.dtype:
            raise FactsGap(f"the tensors {pattern_of(tensor.name)} have different dtypes")
    build = BuildFacts(dtypes, view.keep_fp32(build_dtype), view.probe(build_dtype))
    return CostFacts(
        class_name=type(module).__name__, transformers_version=installed_transformers_version() or "",
        roles_fingerprint=roles_fingerprint(), key=key, config=config_snapshot(config),
        text=_text_choice(config), can_generate=view.can_generate, supports_checkpointing=view.supports_checkpointing,
        matmul_classes=tuple(sorted(view.matmul_classes)), linear_classes=tuple(sorted(view.linear_classes)),
        default_skips=view.default_skips, builds={build_dtype: build})


def view_from_facts(facts: CostFacts, root: Any) -> ModelView:
    """The engines' view of the template's stand-ins `root`, with the facts for what they do not show."""

    def build(dtype: str) -> BuildFacts:
        found = facts.builds.get(dtype)
        if found is None:
            raise FactsGap(f"no cost facts recorded for a build in {dtype}")
        return found

    return ModelView(
        class_name=facts.class_name, config=FactsConfig(facts.config, facts.text), root=root,
        can_generate=facts.can_generate, supports_checkpointing=facts.supports_checkpointing,
        matmul_classes=frozenset(facts.matmul_classes),
        linear_classes=frozenset(facts.linear_classes), default_skips=facts.default_skips,
        keep_fp32=lambda dtype: build(dtype).keep_fp32, probe=lambda dtype: build(dtype).probe)


def set_build_dtypes(root: Any, facts: CostFacts, dtype: str) -> None:
    """Give the stand-in tensors the dtypes a build in `dtype` gives them (FactsGap when not recorded)."""
    from ...template import pattern_of, stub_dtype

    build = facts.builds.get(dtype)
    if build is None:
        raise FactsGap(f"no cost facts recorded for a build in {dtype}")
    seen: set[int] = set()
    for name, module in root.named_modules():
        for table in (module._parameters, module._buffers):
            for local, tensor in table.items():
                if id(tensor) in seen:  # a tied tensor, set under its canonical (first) name
                    continue
                seen.add(id(tensor))
                full = f"{name}.{local}" if name else local
                found = build.dtypes.get(pattern_of(full))
                if found is None:
                    raise FactsGap(f"no recorded dtype for {full}")
                tensor.dtype = stub_dtype(found)


# ------------------------------------------------------------------------------------------- report and view


def cost_view(source: Any, *, dtype: str | None = None, use_cache: bool = True, why_not: str | None = None,
              model_class: str | None = None, task: str | None = None, num_labels: int | None = None,
              trust_remote_code: bool = False) -> tuple[Any, ModelView]:
    """(Report, ModelView) of `source` built in `dtype` (None: torch's default, float32): from its template and
    cost facts where both are recorded (no torch), else from the meta build, whose report then says why
    (`why_not`, when the caller already knows)."""
    from dataclasses import replace

    from ...api import inspect_with_module
    from ...build import check_cost_layers
    from ..model_view import from_module

    if use_cache and not trust_remote_code:
        answer, why = _facts_answer(source, dtype, model_class=model_class, task=task, num_labels=num_labels)
        if answer is not None:
            return answer
        why_not = why_not or why
    check_cost_layers(source.config)  # a build for the cost engines: at most MAX_COST_LAYERS, before it starts
    report, module = inspect_with_module(source, dtype=dtype, model_class=model_class, task=task,
                                         num_labels=num_labels, trust_remote_code=trust_remote_code)
    if why_not:
        report = replace(report, model=replace(report.model, engine_detail=why_not))
    return report, from_module(module)


def recorded_view(source: Any, *, model_class: str | None = None, task: str | None = None,
                  num_labels: int | None = None) -> tuple[Any, ModelView] | None:
    """(Report, ModelView) from the template and cost facts where both are recorded (no torch, no transformers
    import); None elsewhere. For a check before the build (pipeline_trace_reach) that must not build: it reads the
    config and class from here, and only where they are not recorded makes them from the config's dict."""
    return _facts_answer(source, None, model_class=model_class, task=task, num_labels=num_labels)[0]


def answer_from_facts_or_build(source: Any, answer: Any, *, dtype: str | None = None, use_cache: bool = True,
                               why_none: Any = None, **model_options: Any) -> tuple[Any, ModelView, Any]:
    """(report, view, answer(report, view)), from the template and cost facts where they answer, else from the
    meta build. `answer` returns None where it needs the built module (a traced step); `why_none(report, view)`
    says why, for the report's engine line. A read the facts do not hold (FactsGap), or arithmetic that tampered
    facts break, makes the build answer too; a user-facing error (ParamscopeError) is raised as it is."""
    from ...errors import ParamscopeError
    from ..model_view import gap_words

    report, view = cost_view(source, dtype=dtype, use_cache=use_cache, **model_options)
    if view.module is None:
        try:
            result = answer(report, view)
            if result is not None:
                return report, view, result
            why = why_none(report, view) if why_none else "the answer needs the built module"
        except ParamscopeError:
            raise
        except Exception as gap:  # broad on purpose: a FactsGap, or facts a hand-edited cache broke (any error)
            why = gap_words(gap)
        report, view = cost_view(source, dtype=dtype, use_cache=False, why_not=why, **model_options)
    return report, view, answer(report, view)


def _facts_answer(source: Any, dtype: str | None, *, model_class: str | None, task: str | None,
                  num_labels: int | None) -> tuple[tuple[Any, ModelView] | None, str | None]:
    from ...api import template_stand_ins
    from ...errors import AssumptionError
    from ...template import report_from_template

    template, reason, root, why = template_stand_ins(source, model_class=model_class, task=task,
                                                     num_labels=num_labels)
    if template is None:
        return None, why
    key = facts_key(source.config, model_class=model_class, task=task, num_labels=num_labels)
    facts = find_facts(template.class_name, key)
    if facts is None:
        return None, (f"no cost facts recorded yet for this config of {template.class_name} (the build answers "
                      "once and records them)")
    try:
        if dtype is not None:
            set_build_dtypes(root, facts, dtype)
        report = report_from_template(template, source, num_labels=num_labels, class_reason=reason, root=root)
    except FactsGap as gap:
        return None, str(gap)
    except AssumptionError as err:
        return None, f"the template for {template.class_name} does not apply: {err}"
    return (report, view_from_facts(facts, root)), None


def find_facts(class_name: str, key: str) -> CostFacts | None:
    """The facts for `key` in the package, else in the user's cache (which never overrides the package's)."""
    from ...template import cache_directory, shipped_directory

    version = installed_transformers_version()
    if version is None:
        return None
    for root in (shipped_directory(version), cache_directory(version)):
        facts = read_facts(facts_directory(class_directory(root, class_name)), key, class_name)
        if facts is not None:
            return facts
    return None


# -------------------------------------------------------------------------------------------------- the cache


def facts_directory(template_directory: Path) -> Path:
    """Where the facts of a class live: beside its templates (<templates>/<class>/costs/)."""
    return template_directory / "costs"


def read_facts(directory: Path, key: str, class_name: str) -> CostFacts | None:
    """The facts in `directory` for `key`, when they are whole and for this class, version and role rules."""
    try:
        facts = CostFacts.from_json(read_entry(directory / f"{safe_name(key)}.json"))
    except CacheEntryError:  # unreadable (disk_cache.UnreadableEntry) or malformed
        return None
    if (facts.key != key or facts.class_name != class_name
            or facts.transformers_version != installed_transformers_version()
            or facts.roles_fingerprint != roles_fingerprint()):
        return None
    return facts


def write_facts(facts: CostFacts, directory: Path) -> Path | None:
    """Keep `facts`, merged with the builds already kept for the same config; the path, or None."""
    existing = read_facts(directory, facts.key, facts.class_name)
    if existing is not None and existing.config == facts.config:
        facts = dataclasses.replace(facts, builds={**existing.builds, **facts.builds})
    return write_entry(directory / f"{safe_name(facts.key)}.json", facts.to_json())


__all__ = ["BuildFacts", "CostFacts", "FactsConfig", "answer_from_facts_or_build", "config_snapshot", "cost_view",
           "facts_from_module",
           "facts_key", "find_facts", "read_facts", "set_build_dtypes", "snapshot_of", "view_from_facts", "write_facts"]
