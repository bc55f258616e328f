"""The JSON contract (docs/json-schema.md). Bump SCHEMA_VERSION on any breaking change."""

from __future__ import annotations

import json as _json
from typing import Any

from ..count import ModuleNode
from ..report import SCHEMA_VERSION, Report


def report_to_dict(report: Report) -> dict[str, Any]:
    model = report.model
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "source": model.source,
            "source_kind": model.source_kind,
            "label": model.label,
            "class": model.class_name,
            "class_reason": model.class_reason,
            "model_type": model.model_type,
            "native": model.native,
            "transformers_version": model.transformers_version,
            "notes": list(model.notes),
        },
        "parameters": {
            "total": report.parameters.total,
            "trainable": report.parameters.trainable,
            "frozen": report.parameters.frozen,
            "with_tied_duplicates": report.parameters.with_tied_duplicates,
            "buffers": report.parameters.buffers,
        },
        "tied": [
            {"canonical": group.canonical, "aliases": list(group.aliases), "numel": group.numel,
             "shape": list(group.shape)}
            for group in report.tied
        ],
        "breakdown": dict(report.breakdown),
        "unclassified": list(report.unclassified),
        "components": [
            {"name": c.name, "type": c.type, "params": c.params,
             "repeated": None if c.repeated is None else
             {"type": c.repeated[0], "count": c.repeated[1], "params_each": c.repeated[2]}}
            for c in report.components
        ],
        "layers": report.num_layers,
        "buffers": [
            {"name": b.name, "shape": list(b.shape), "numel": b.numel, "persistent": b.persistent}
            for b in report.buffers
        ],
        "tensors": [
            {"name": p.name, "shape": list(p.shape), "numel": p.numel, "role": p.role,
             "trainable": p.trainable, "dtype": p.dtype, "aliases": list(p.aliases)}
            for p in report.params
        ],
        "tree": tree_to_dict(report.tree),
    }


def tree_to_dict(node: ModuleNode) -> dict[str, Any]:
    out: dict[str, Any] = {"name": node.name, "type": node.type, "params": node.params}
    if node.tied:
        out["tied"] = {local: canonical for local, canonical in node.tied}
    out["children"] = [tree_to_dict(child) for child in node.children]
    return out


def render_json(report: Report, *, indent: int | None = 2) -> str:
    return _json.dumps(report_to_dict(report), indent=indent, ensure_ascii=False)
