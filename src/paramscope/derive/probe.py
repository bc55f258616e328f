"""Probe builds: the anchor config with some fields changed, built on meta once each and kept as a Snapshot.

A snapshot groups a build's parameters into families (names equal once layer and expert indices become `*`), each
with its multiplicity and shape; in template mode (template_record.py) it also holds buffers, runs of layers and the
module skeleton. The Prober builds each distinct probe once, counts the builds and keeps, in order, every config that
could be built: template_record.py checks its template's reports at them.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .. import progress
from ..errors import FormulaError

if TYPE_CHECKING:
    from .fields import Fields

Take = Callable[[Any], "Snapshot"]  # a module built on meta → its snapshot


@dataclass(frozen=True)
class Snapshot:
    fams: dict[tuple[str, str, int], tuple[int, tuple[int, ...]]]  # (pattern, role, k) → (multiplicity, shape)
    total: int
    breakdown: dict[str, int]
    # Template mode (template_record.py): the module skeleton with every size left out (class names, buffers,
    # ties, which runs of layers a stack holds), so that a field changing anything in the report is structural.
    skeleton: str = ""

    def structure(self) -> frozenset:
        return frozenset((key, len(shape)) for key, (_, shape) in self.fams.items()) | {("skeleton", self.skeleton)}

    def same(self, other: "Snapshot") -> bool:
        return self.fams == other.fams and self.skeleton == other.skeleton


@dataclass(frozen=True)
class Probe:
    """One config a derivation built, with its num_labels and what the build showed."""

    config: dict[str, Any]
    num_labels: int | None
    snapshot: Snapshot


def family_pattern(name: str) -> str:
    """`bert.encoder.layer.3.attention.self.query.weight` → `bert.encoder.layer.*.attention.self.query.weight`."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def snapshot(counted) -> Snapshot:
    """Families keyed by (pattern, role, k): k tells apart shapes that share a pattern (rare, e.g. mixed layers)."""
    members: dict[tuple[str, str], list[tuple[int, ...]]] = {}
    for info in counted.parameters:
        members.setdefault((family_pattern(info.name), info.role), []).append(info.shape)
    fams: dict[tuple[str, str, int], tuple[int, tuple[int, ...]]] = {}
    for (pattern, role), shapes in members.items():
        distinct: list[tuple[int, ...]] = []
        for shape in shapes:
            if shape not in distinct:
                distinct.append(shape)
        for k, shape in enumerate(distinct):
            fams[(pattern, role, k)] = (shapes.count(shape), shape)
    return Snapshot(fams, counted.counts.total, dict(counted.breakdown))


def parameter_snapshot(module: Any) -> Snapshot:
    """A formula's snapshot of a built module: its parameter families."""
    from ..count import count_module

    return snapshot(count_module(module))


def build_module(config_dict: dict[str, Any], class_name: str, num_labels: int | None = None):
    """make_config → build_on_meta, quietly: the same path `paramscope inspect` takes."""
    from ..build import build_on_meta, make_config, quiet_transformers

    with quiet_transformers():
        config, _ = make_config(config_dict, num_labels=num_labels)
        return build_on_meta(class_name, config)


def count_build(config_dict: dict[str, Any], class_name: str, num_labels: int | None = None):
    """build_module → count_module: the counted meta build."""
    from ..count import count_module

    return count_module(build_module(config_dict, class_name, num_labels))


def build_anchor(config: dict[str, Any], class_name: str, num_labels: int | None, take: Take,
                 max_build_s: float | None = None) -> tuple[Any, Snapshot]:
    """(module, snapshot) of the anchor config; FormulaError when its build alone takes over `max_build_s`."""
    started = time.perf_counter()
    module = build_module(config, class_name, num_labels)
    spent = time.perf_counter() - started
    if max_build_s is not None and spent > max_build_s:
        raise FormulaError(f"one build of {class_name} takes {spent:.1f} s here; deriving its structure "
                           "would take 30–50 of them")
    return module, take(module)


class Prober:
    """The probe builds around one anchor, each distinct one built once; past `deadline` (time.perf_counter()) a
    build raises FormulaError."""

    def __init__(self, fields: "Fields", class_name: str, num_labels: int | None, anchor: Snapshot, take: Take,
                 deadline: float | None = None):
        self.fields = fields
        self.class_name = class_name
        self.num_labels = num_labels
        self.anchor = anchor
        self.take = take
        self.deadline = deadline
        self.builds = 1  # the anchor's
        self._snapshots: dict[str, Snapshot | None] = {json.dumps([]): anchor}  # probe key → None: not buildable
        self._built: list[Probe] = [Probe(copy.deepcopy(fields.base), num_labels, anchor)]

    def probe(self, overrides: dict[str, Any]) -> Snapshot | None:
        """The anchor config with `overrides` (path → value), built on meta; None when it cannot be built."""
        key = json.dumps(sorted(overrides.items()), default=str)
        if key in self._snapshots:
            return self._snapshots[key]
        config = self.fields.config_with(overrides)
        num_labels = overrides.get("num_labels", self.num_labels)
        self.builds += 1
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise FormulaError(f"deriving {self.class_name}'s structure took longer than its time budget")
        progress.update(f"deriving {self.class_name}'s structure: probe build {self.builds} on meta")
        try:
            snap = self.take(build_module(config, self.class_name, num_labels))
            self._built.append(Probe(config, num_labels, snap))
        except Exception:  # a ParamscopeError, or a config the class's own code rejects: not a usable probe
            snap = None
        self._snapshots[key] = snap
        return snap

    def probes(self) -> tuple[Probe, ...]:
        """Every config built so far, the anchor first, in the order they were built."""
        return tuple(self._built)
