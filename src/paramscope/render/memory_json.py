"""`paramscope memory --json`: a MemoryEstimate → the JSON "memory" object (docs/json-schema.md). Pure functions of
their data."""

from __future__ import annotations

from typing import Any

from ..frozen import thaw
from .check import check_to_dict
from .memory_fits import fit_to_dict
from .memory_layout import device_words, peak_sum


def _term(term) -> dict[str, Any]:
    return {"bytes": term.bytes, "arithmetic": term.arithmetic}


def memory_to_dict(estimate) -> dict[str, Any]:
    weights, cache, training = estimate.weights, estimate.kv_cache, estimate.training
    return {
        "mode": estimate.mode,
        "engine": estimate.engine,
        "settings": thaw(estimate.settings),  # a FrozenDict, lists inside as tuples: plain data for json
        "weights": {
            "bytes": weights.bytes,
            "format": weights.format.key,
            "format_label": weights.format.label,
            "quantized_parameters": weights.quantized,
            "overhead_bytes": weights.overhead,
            "by_dtype": dict(weights.by_dtype),
            "by_role": dict(weights.by_role),
            "by_component": dict(weights.by_component),
        },
        "buffers": {"bytes": weights.buffer_bytes, "by_dtype": dict(weights.buffers_by_dtype)},
        "kv_cache": None if cache is None else {
            "bytes": cache.bytes,
            "bytes_per_token": cache.bytes_per_token,
            "layout": cache.layout,
            "dtype": cache.dtype,
            "groups": [{"kind": g.kind, "layers": g.layers, "tokens": g.tokens, "bytes_per_token": g.per_token,
                        "fixed_bytes_per_sequence": g.fixed, "bytes": g.bytes, "arithmetic": g.arithmetic}
                       for g in cache.groups],
            "convention": cache.convention,
        },
        "gradients": _term(training.states.gradients) if training else None,
        "optimizer": _term(training.states.optimizer) if training else None,
        "master_weights": _term(training.states.master_weights) if training else None,
        "activations": None if estimate.activations is None else {
            "bytes": estimate.activations.bytes, "arithmetic": estimate.activations.arithmetic,
            "what": "saved for backward" if training else "prefill workspace",
            **({"source": training.activation_source,
                "towers": [{"part": part, "module": path, "bytes": value} for part, path, value in training.towers]}
               if training else {})},
        "peak": {"bytes": estimate.peak, "phase": estimate.peak_phase},
        "phases": [{"phase": p.phase, "moment": p.where, "bytes": p.bytes, "gradients": p.gradients,
                    "arithmetic": p.arithmetic} for p in training.phases] if training else None,
        "traced": _traced_to_dict(estimate),
        "trainable_parameters": training.states.trainable if training else None,
        "frozen_parameters": training.states.frozen if training else None,
        "reserve": estimate.reserve,
        "per_device": dict(training.per_device) if training and training.per_device else
        _layout_per_device(training.device) if training and training.device is not None else None,
        "layout": _serving_layout_to_dict(estimate) if not training else None if training.device is None else {
            **{k: v for k, v in estimate.settings["layout"].items()}, "device": _device_to_dict(training.device)},
        "smallest_tp": None if training or estimate.parallel is None or estimate.parallel.smallest is None else
        smallest_to_dict(estimate.parallel.smallest),
        "fits": [{"accelerator": f.accelerator.name, "memory": f.accelerator.memory, "fits": f.fits,
                  "free": f.free, "largest_batch": f.largest_batch, "largest_context": f.largest_context}
                 for f in estimate.fits],
        "budget": None if estimate.budget is None else fit_to_dict(estimate.budget),
        "notes": list(estimate.notes),
        "check": check_to_dict(estimate.check),
    }


def _layout_per_device(device) -> dict[str, Any]:
    """Under a layout, `per_device` as under --devices/--zero: the device's shares and its peak, which `peak` is, so
    the schema's "peak is per device when per_device is set" holds (`layout.device` has the rest)."""
    top = device.peak_figure
    return {"weights": device.weights, "gradients": device.gradients, "optimizer": device.optimizer,
            "master_weights": device.master_weights, "activations": device.activations, "peak": top.bytes,
            "peak_phase": top.phase}


def _serving_layout_to_dict(estimate) -> dict[str, Any] | None:
    """Serving across GPUs: the layout, then each stage's GPU (rank 0 of its tensor-parallel group)."""
    layout = estimate.parallel.layout if estimate.parallel is not None else None
    if layout is None:
        return None

    def stage(s) -> dict[str, Any]:
        w, cache = s.weights, s.kv_cache
        return {"stage": s.rank, "layers": list(s.layers) if s.layers else None, "layer_count": s.layer_count,
                "first": s.first, "last": s.last,
                "weights": {"bytes": w.bytes, "overhead_bytes": w.overhead, "quantized_parameters": w.quantized,
                            "by_dtype": dict(w.by_dtype), "by_role": dict(w.by_role)},
                "buffers": w.buffer_bytes,
                "kv_cache": None if cache is None else {
                    "bytes": cache.bytes, "bytes_per_token": cache.bytes_per_token,
                    "groups": [{"kind": g.kind, "layers": g.layers, "tokens": g.tokens, "bytes_per_token": g.per_token,
                                "fixed_bytes_per_sequence": g.fixed, "bytes": g.bytes, "arithmetic": g.arithmetic}
                               for g in cache.groups]},
                "workspace": None if s.workspace is None else {"bytes": s.workspace.bytes,
                                                               "arithmetic": s.workspace.arithmetic},
                "correction": s.correction, "moe_gathered": s.gathered, "moe_workspace": s.experts_workspace,
                "peak": s.peak}

    return {"devices": layout.devices, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "dp": layout.dp,
            "words": layout.words(),
            "kv_heads": layout.kv_heads, "workspace_from": layout.workspace_from, "pipeline": layout.pipeline or None,
            "rules": dict(layout.rules), "device": stage(layout.device),
            "moe_dispatch": None if layout.dispatch is None else layout.dispatch.arithmetic(
                estimate.settings["batch"], estimate.settings["seq"]),
            "moe_workspace": None if layout.experts_workspace is None else layout.experts_workspace.arithmetic(
                estimate.settings["batch"], estimate.settings["seq"]),
            "stages": [stage(s) for s in layout.stages]}


def smallest_to_dict(smallest) -> dict[str, Any]:
    return {"accelerator": smallest.accelerator.name, "memory": smallest.accelerator.memory, "pp": smallest.pp,
            "batch": smallest.batch, "seq": smallest.seq, "tp": smallest.tp, "peak": smallest.peak,
            "dp": smallest.dp, "ep": smallest.expert_parallel, "dp_searched": smallest.dp_searched,
            "order": smallest.order_words(),
            "tried": [{"tp": t, "dp": d, "peak": peak, "refused": why or None} for (t, peak, why), d in
                      zip(smallest.tried, smallest.tried_dp or [smallest.dp] * len(smallest.tried))]}


def _traced_to_dict(estimate) -> dict[str, Any] | None:
    """The traced engine's figures: a full-depth trace's MemTracker breakdown, or the depth-extended trace's peak
    (its `by_category` and `activations_by_module` empty: the extension adds up allocations, not categories)."""
    training = estimate.training
    if not training or training.trace_depth is None:
        return None
    full = training.traced
    top = max(training.phases, key=lambda p: p.bytes)  # one device's, before any sharding, as a full trace's
    return {"peak": full.peak.bytes if full else top.bytes, "phase": full.peak.phase if full else top.phase,
            "depth": training.trace_depth,
            "by_category": dict(training.by_category), "analytic_peak": training.analytic_peak,
            "analytic_activations": training.analytic_activations,
            "activations_by_module": [{"module": path, "bytes": value}
                                      for path, value in (full.kept_by_module if full else ())]}


def _device_to_dict(device) -> dict[str, Any]:
    top = device.peak_figure
    return {"weights": device.weights, "gradients": device.gradients, "optimizer": device.optimizer,
            "master_weights": device.master_weights, "buffers": device.buffers, "activations": device.activations,
            "accumulation_buffer": device.accumulation_buffer,
            "activations_from": device.activations_from, "states_arithmetic": device.states_arithmetic,
            "communication": [{"name": b.name, "bytes": b.bytes, "arithmetic": b.arithmetic,
                               "moments": list(b.moments)} for b in device.comm],
            "phases": [{"phase": p.phase, "moment": p.where, "bytes": p.bytes, "gradients": p.gradients,
                        "arithmetic": p.arithmetic} for p in device.phases],
            "peak": {"bytes": top.bytes, "phase": top.phase, "moment": top.where, "arithmetic": peak_sum(device)},
            "shown": device_words(device),
            "rules": dict(device.rules),
            "pipeline": device.pipeline or None, "bubble": device.bubble,
            "stages": [{"stage": st.rank, "layers": list(st.layers) if st.layers else None,
                        "chunks": [list(c) for c in st.chunks],
                        "layer_count": st.layer_count, "in_flight": st.in_flight, "first": st.first, "last": st.last,
                        "weights": st.weights, "gradients": st.gradients, "optimizer": st.optimizer,
                        "master_weights": st.master_weights, "activations": st.activations, "peak": st.peak,
                        "peak_phase": st.peak_phase} for st in device.stages]}
