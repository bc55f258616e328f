"""Derived formulas kept in the disk cache, and the lookup that answers a config from them without torch,
transformers or sympy.

One file per formula (formula_spec.FormulaSpec as JSON), in the disk cache's layout (disk_cache.py):

    <cache>/paramscope-<version>/formulas/v<FORMAT>/<transformers version>/<class>/<hash of the conditions>.json
    <cache>/paramscope-<version>/formulas/v<FORMAT>/<transformers version>/routes/<hash of the request>.json

(the second: request → class), so an entry is read only by the paramscope and transformers versions that wrote it.

So the cached path of `paramscope formula` reads one small JSON file. Reading never trusts it: an entry is read
and checked by the disk cache and FormulaSpec.from_json, filed under its own conditions' hash, and must reproduce
its own anchor (the count, total and per role, of the config it was derived from) before it is used. An entry that
fails any of these is skipped with a note in `Lookup.rejected`; `lookup` raises for no cache content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .disk_cache import (bound_root, class_directory, entry_path, installed_transformers_version, read_entries,
                         read_route, roles_fingerprint, route_file, route_key, versioned_directory, write_entry)
from .formula_spec import FORMAT, FormulaSpec


def formula_directory(version: str) -> Path:
    """Where the formulas this paramscope version derived with transformers `version` are kept."""
    return versioned_directory(bound_root() / "formulas", FORMAT, version)


def store(spec: FormulaSpec, *, route: str | None = None) -> Path | None:
    """Keep `spec` on disk; returns its path, or None when the cache directory cannot be written."""
    directory = formula_directory(spec.transformers_version)
    return write_entry(entry_path(directory, spec.class_name, spec.key()), spec.to_json(),
                       route=(route_file(directory, route), {"route": route, "class": spec.class_name}) if route
                       else None)


@dataclass(frozen=True)
class Lookup:
    spec: FormulaSpec | None
    values: dict[str, int] = field(default_factory=dict)
    path: Path | None = None
    class_name: str | None = None
    rejected: tuple[str, ...] = ()  # why the cached formulas of this class did not apply


def lookup(config: dict[str, Any], *, model_class: str | None = None, task: str | None = None,
           num_labels: int | None = None) -> Lookup:
    """The cached formula whose assumptions `config` meets, with the symbols' values; never imports torch."""
    version = installed_transformers_version()
    if version is None or not isinstance(config.get("model_type"), str):
        return Lookup(None)
    directory = formula_directory(version)
    class_name = model_class
    if class_name is None:
        route = read_route(directory, route_key(config, model_class=None, task=task))
        if route is None:
            return Lookup(None)
        class_name = route["class"]
    fingerprint = roles_fingerprint()
    rejected = []
    for entry, spec, why_not in read_entries(class_directory(directory, class_name), FormulaSpec.from_json):
        if spec is None:
            rejected.append(f"cache entry {entry.name} {why_not}")
            continue
        if spec.roles_fingerprint != fingerprint or spec.class_name != class_name:
            continue
        if entry.stem != spec.key():
            rejected.append(f"cache entry {entry.name} discarded: its conditions are not the ones it was filed under")
            continue
        problem = spec.anchor_problem()
        if problem:
            rejected.append(f"cache entry {entry.name} discarded: {problem}")
            continue
        problems = spec.violations(config, num_labels)
        if problems:
            rejected.append(problems[0])
            continue
        return Lookup(spec, spec._values(config, num_labels), entry, class_name)
    return Lookup(None, class_name=class_name, rejected=tuple(rejected))
