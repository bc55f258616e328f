"""One device's training step under a layout: its model states, activations, communication buffers and peak.

    Report + view → placements (rules.py: each parameter's tensor/expert-parallel cut, from its role)
    → the device's model states (states.py: the shards, then ZeRO's or FSDP2's data-parallel share)
    → its activations: data parallel alone leaves a rank's step as one device's (its own batch); under tensor
      parallelism the family's recipe on the rank's shard (activations.py), or the step traced on torch's fake
      process group (traced/parallel.py)
    → the communication buffers that matter (FSDP2's all-gathered units)
    → each moment with the device's figures, and the largest: the device's peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ...frozen import FrozenDict, freeze_fields
from ..memory.phases import PhaseFigure
from .layout import ParallelLayout, shard_words
from .rules import Placement, model_shape, place, tp_rule_words
from .states import DeviceStates, device_states

_LAYER = re.compile(r"^(.*?\.)(\d+)\.")


@dataclass(frozen=True)
class Buffer:
    """A communication buffer live at some moments of the step: what it is, its bytes, when."""

    name: str
    bytes: int
    arithmetic: str
    moments: tuple[str, ...]  # the phases whose moments hold it


@dataclass(frozen=True)
class DeviceMemory:
    """One device's share of a training step under `layout` (rank 0: the largest share wherever a cut is uneven)."""

    layout: ParallelLayout
    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    buffers: int  # the model's own buffers (rotary tables), replicated
    activations: int  # what this device's forward saves for backward
    activations_from: str
    states_arithmetic: str
    comm: tuple[Buffer, ...]
    phases: tuple[PhaseFigure, ...]
    rules: FrozenDict[str, str]  # role → its tensor/expert-parallel rule in words
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        freeze_fields(self, "rules")

    @property
    def peak_figure(self) -> PhaseFigure:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak(self) -> int:
        return self.peak_figure.bytes


def placements_for(report: Any, view: Any, layout: ParallelLayout) -> tuple[Placement, ...]:
    from ..dims import text_config

    classes = {sub.__class__.__name__ for _, sub in view.root.named_modules()} if view.root is not None else set()
    return place(report.params, model_shape(text_config(view.config), classes), tp=layout.tp, ep=layout.ep)


def rules_in_words(placements: tuple[Placement, ...], layout: ParallelLayout) -> dict[str, str]:
    words: dict[str, str] = {}
    for p in placements:
        if p.role in words:
            continue
        rule = tp_rule_words(p.tp, layout.tp) if layout.tp > 1 else "whole"
        if p.experts_split:
            rule += f"; experts / ep {layout.ep}"
        words[p.role] = rule
    return dict(sorted(words.items()))


def fsdp_units(placements: tuple[Placement, ...], weight_bytes: Callable[[Placement], int]) -> tuple[int, int]:
    """(the root unit's bytes, the largest layer unit's bytes) as FSDP2 all-gathers them on a rank: fully_shard on
    each layer of the stack and on the root, which holds the rest (embeddings, final norm, head)."""
    layers: dict[str, int] = {}
    root = 0
    for p in placements:
        match = _LAYER.match(p.name)
        if match:
            key = match.group(0)
            layers[key] = layers.get(key, 0) + weight_bytes(p)
        else:
            root += weight_bytes(p)
    return root, max(layers.values(), default=0)


def device_memory(report: Any, view: Any, layout: ParallelLayout, *, precision: str, optimizer: str,
                  trainable: frozenset[str], own: frozenset[str], buffer_bytes: int,
                  phases_for: Callable[[DeviceStates], tuple[PhaseFigure, ...]], activations: int,
                  activations_from: str, placements: tuple[Placement, ...] | None = None) -> DeviceMemory:
    """Rank 0's figures. `phases_for(states)`: the step's moments with the device's model states (resident weights,
    buffers, optimizer states and master weights, and its gradients) and its activations."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    placements = placements or placements_for(report, view, layout)
    states = device_states(report.params, placements, layout, precision=precision, optimizer=optimizer,
                           trainable=trainable, own=own)
    comm: list[Buffer] = []
    notes: list[str] = []
    if layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        def unsharded(p: Placement) -> int:
            return p.local_numel * itemsize(trained_dtype(p, precision, own))  # type: ignore[arg-type]
        root, layer = fsdp_units(placements, unsharded)
        comm.append(Buffer("FSDP2's root unit, all-gathered", root,
                           f"the parameters outside the layers (embeddings, final norm, head) unsharded, {root:,} B: "
                           "the root unit is not resharded after the forward", ("forward", "backward")))
        comm.append(Buffer("FSDP2's layer unit, all-gathered", layer,
                           f"one layer's parameters unsharded while it runs, {layer:,} B", ("backward",)))
    phases = phases_for(states)
    if comm:
        phases = tuple(_with_buffers(p, comm) for p in phases)
    return DeviceMemory(layout, states.weights, states.gradients, states.optimizer, states.master_weights,
                        buffer_bytes, activations, activations_from, states.arithmetic, tuple(comm), phases,
                        rules_in_words(placements, layout), tuple(notes))


def _with_buffers(phase: PhaseFigure, comm: list[Buffer]) -> PhaseFigure:
    import dataclasses

    held = [b for b in comm if phase.phase in b.moments and phase.where not in ("optimizer step", "end of backward")]
    if not held:
        return phase
    extra = sum(b.bytes for b in held)
    return dataclasses.replace(phase, bytes=phase.bytes + extra,
                               arithmetic=phase.arithmetic + "; + " + " + ".join(
                                   f"{b.name} {b.bytes:,}" for b in held))


def layout_settings(layout: ParallelLayout) -> dict[str, Any]:
    return {"devices": layout.devices, "dp": layout.dp, "shard": layout.shard, "shard_words": shard_words(layout),
            "shard_degree": layout.shard_degree, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp,
            "micro_batches": layout.micro_batches, "schedule": layout.schedule,
            "virtual_stages": layout.virtual_stages, "ep": layout.ep, "cp": layout.cp, "words": layout.words()}
