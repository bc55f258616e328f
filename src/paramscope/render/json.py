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
            "storage": _storage(model.storage),
            "engine": {"name": model.engine, "detail": model.engine_detail},
        },
        "parameters": {
            "total": report.parameters.total,
            "trainable": report.parameters.trainable,
            "frozen": report.parameters.frozen,
            "with_tied_duplicates": report.parameters.with_tied_duplicates,
            "buffers": report.parameters.buffers,
            "active": report.parameters.active,
        },
        "tied": [
            {"canonical": group.canonical, "aliases": list(group.aliases), "numel": group.numel,
             "shape": list(group.shape)}
            for group in report.tied
        ],
        "breakdown": dict(report.breakdown),
        "unclassified": list(report.unclassified),
        "uninitialized": list(report.uninitialized),
        "components": [
            {"name": c.name, "type": c.type, "params": c.params,
             "repeated": None if c.repeated is None else
             {"type": c.repeated[0], "count": c.repeated[1], "params_each": c.repeated[2]},
             "shared": c.shared}
            for c in report.components
        ],
        "layers": report.num_layers,
        "buffers": [
            {"name": b.name, "shape": list(b.shape), "numel": b.numel, "persistent": b.persistent, "role": b.role,
             "dtype": b.dtype}
            for b in report.buffers
        ],
        "tensors": [
            {"name": p.name, "shape": list(p.shape), "numel": p.numel, "role": p.role,
             "trainable": p.trainable, "dtype": p.dtype, "aliases": list(p.aliases)}
            for p in report.params
        ],
        "tree": tree_to_dict(report.tree),
        "moe": moe_to_dict(report.moe),
        "conventions": {
            c.key: {"label": c.label, "value": c.value, "definition": c.definition} for c in report.conventions
        },
        "shared_layers": [
            {"path": s.path, "layer_type": s.layer_type, "layers": s.layers, "sets": s.sets,
             "params_per_set": list(s.params_per_set), "params": s.params, "text": s.text, "how": s.how}
            for s in report.shared_layers
        ],
    }


def moe_to_dict(moe) -> dict[str, Any] | None:
    if moe is None:
        return None
    return {
        "num_experts": moe.num_experts,
        "top_k": moe.top_k,
        "num_shared_experts": moe.num_shared_experts,
        "layout": moe.layout,
        "total": moe.total,
        "active": moe.active,
        "inactive": moe.inactive,
        "routed_experts": moe.routed,
        "shared_experts": moe.shared,
        "router": moe.router,
        "source": moe.source,
        "definition": moe.definition,
        "layers": [
            {"name": layer.name, "index": layer.index, "kind": layer.kind, "params": layer.params,
             "routed_experts": layer.routed, "shared_experts": layer.shared, "router": layer.router,
             "num_experts": layer.num_experts, "top_k": layer.top_k, "active": layer.active}
            for layer in moe.layers
        ],
    }


def _storage(storage) -> dict[str, Any] | None:
    if storage is None:
        return None
    return {"dtype": storage.dtype, "quant_method": storage.quant_method, "bits": storage.bits,
            "description": storage.description, "unquantized": list(storage.unquantized)}


def tree_to_dict(node: ModuleNode) -> dict[str, Any]:
    out: dict[str, Any] = {"name": node.name, "type": node.type, "params": node.params}
    if node.tied:
        out["tied"] = {local: canonical for local, canonical in node.tied}
    if node.back_reference is not None:
        out["back_reference"] = node.back_reference
    out["children"] = [tree_to_dict(child) for child in node.children]
    return out


def render_json(report: Report, *, indent: int | None = 2) -> str:
    return _json.dumps(report_to_dict(report), indent=indent, ensure_ascii=False)
