"""Several reports side by side: totals, role groups, roles and shares. Pure: Reports → a frozen Comparison."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from .frozen import FrozenDict, freeze_fields
from .report import SCHEMA_VERSION, Report
from .roles import role_group, role_sort_key


@dataclass(frozen=True)
class Column:
    """One model of the comparison."""

    label: str  # what the user typed (MODEL[:CLASS])
    class_name: str
    model_type: str | None
    total: int
    trainable: int
    with_tied_duplicates: int
    buffers: int
    layers: int | None
    breakdown: FrozenDict[str, int]  # role → count (roles the model has)
    groups: FrozenDict[str, int]  # role group (embeddings, attention, mlp, …) → count
    # Parameters a token uses (moe.py's definition): a dense model's total, as the report's `active`; None for a
    # mixture of experts whose top-k the config does not give
    active: int | None = None
    moe: bool = False  # routed experts: `active` is less than the total

    def __post_init__(self) -> None:
        freeze_fields(self, "breakdown", "groups")

    def share(self, count: int) -> float:
        return count / self.total if self.total else 0.0


@dataclass(frozen=True)
class Comparison:
    columns: tuple[Column, ...]
    roles: tuple[str, ...]  # every role any model has, in display order
    groups: tuple[str, ...]  # every role group any model has, in display order

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "roles": list(self.roles),
            "groups": list(self.groups),
            "models": [
                {
                    "model": c.label,
                    "class": c.class_name,
                    "model_type": c.model_type,
                    "total": c.total,
                    "trainable": c.trainable,
                    "with_tied_duplicates": c.with_tied_duplicates,
                    "buffers": c.buffers,
                    "layers": c.layers,
                    "active": c.active,
                    "groups": {g: c.groups.get(g, 0) for g in self.groups},
                    "breakdown": {r: c.breakdown.get(r, 0) for r in self.roles},
                    "shares": {g: round(c.share(c.groups.get(g, 0)), 6) for g in self.groups},
                }
                for c in self.columns
            ],
        }

    def to_csv(self) -> str:
        """One row per model: totals, then each group's count and share, then each role's count. `active` comes after
        `layers`, so the columns before it keep their places; empty where the active count is unknown."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        header = ["model", "class", "model_type", "total", "trainable", "with_tied_duplicates", "buffers", "layers",
                  "active"]
        header += [f"group:{g}" for g in self.groups] + [f"share:{g}" for g in self.groups]
        header += [f"role:{r}" for r in self.roles]
        writer.writerow(header)
        for c in self.columns:
            row: list[Any] = [c.label, c.class_name, c.model_type or "", c.total, c.trainable,
                              c.with_tied_duplicates, c.buffers, "" if c.layers is None else c.layers,
                              "" if c.active is None else c.active]
            row += [c.groups.get(g, 0) for g in self.groups]
            row += [f"{c.share(c.groups.get(g, 0)):.6f}" for g in self.groups]
            row += [c.breakdown.get(r, 0) for r in self.roles]
            writer.writerow(row)
        return out.getvalue()


def compare_reports(reports: list[Report] | tuple[Report, ...], labels: list[str] | None = None) -> Comparison:
    """Line `reports` up; `labels` name them (default: each report's label and class)."""
    if labels is not None and len(labels) != len(reports):
        raise ValueError("one label per report")
    columns = []
    roles: set[str] = set()
    for i, report in enumerate(reports):
        groups: dict[str, int] = {}
        for role, count in report.breakdown.items():
            groups[role_group(role)] = groups.get(role_group(role), 0) + count
            roles.add(role)
        label = labels[i] if labels else f"{report.model.label}:{report.model.class_name}"
        columns.append(Column(
            label=label,
            class_name=report.model.class_name,
            model_type=report.model.model_type,
            total=report.total,
            trainable=report.parameters.trainable,
            with_tied_duplicates=report.parameters.with_tied_duplicates,
            buffers=report.parameters.buffers,
            layers=report.num_layers,
            breakdown=dict(report.breakdown),
            groups=groups,
            active=report.parameters.active,
            moe=report.moe is not None,
        ))
    ordered_roles = tuple(sorted(roles, key=role_sort_key))
    ordered_groups: list[str] = []
    for role in ordered_roles:
        if role_group(role) not in ordered_groups:
            ordered_groups.append(role_group(role))
    return Comparison(tuple(columns), ordered_roles, tuple(ordered_groups))
