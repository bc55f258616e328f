"""Pipeline stages: which layers each device holds, and how many microbatches' activations it keeps at once.

Layers are split into pp × v chunks in order (v = virtual stages a device, the interleaved schedule's), chunk c on
device c mod pp; an uneven split gives the first chunks one layer more, and the report names it. The embeddings go
with the first device, the final norm and the head with the last; a head tied to the input embedding costs the
last device a copy of it, with its gradient and optimizer states (Megatron's word_embeddings_for_head).

Microbatches in flight on device r, at the most (each one's activations kept until its backward):
    GPipe        m                            every forward before any backward
    1F1B         min(m, pp − r)               torch's Schedule1F1B and Megatron's warm-up
    interleaved  min(m·v, 2(pp − r − 1) + (v − 1)·pp + 1) chunks of a microbatch (Megatron's warm-up, and torch's
                 ScheduleInterleaved1F1B: tests/test_parallel_pipeline.py counts its own order of actions)
The pipeline bubble, idle time over the step: (pp − 1) / (v·m + pp − 1) for 1F1B and interleaved, the same for
GPipe (Narayanan et al. 2021).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, UnsupportedError
from .layout import ParallelLayout

# a name's layer stack and index: "model.layers.3.mlp.up_proj.weight" → ("model.layers", "3")
LAYER_PREFIX = re.compile(r"^(.*?)\.(\d+)\.")


@dataclass(frozen=True)
class Stage:
    rank: int
    layers: tuple[int, ...]  # indices in the layer stack
    chunk_layers: tuple[int, ...]  # layers in each of the device's chunks
    first: bool  # holds the embeddings
    last: bool  # holds the final norm and head
    in_flight: int  # microbatches (interleaved: chunk-microbatches) whose activations it holds at once


def layer_of(name: str, stack: str) -> int | None:
    match = LAYER_PREFIX.match(name)
    return int(match.group(2)) if match and match.group(1) == stack else None


def params_held(params: Any, stack: str, stage: Stage) -> list:
    """The parameters (report rows) stage `stage` holds: its layers' from the stack at `stack`, the embeddings on the
    first stage, everything else outside the layers (the final norm, the head) on the last."""
    held = set(stage.layers)
    out = []
    for p in params:
        index = layer_of(p.name, stack)
        if index is not None and index in held or index is None and (
                stage.first and p.role.startswith("embeddings") or
                stage.last and not p.role.startswith("embeddings")):
            out.append(p)
    return out


def layer_stack_of(names: list[str]) -> tuple[str, int]:
    """(the layer stack's path, its layers) from parameter names; one stack only."""
    stacks: dict[str, set[int]] = {}
    for name in names:
        match = LAYER_PREFIX.match(name)
        if match:
            stacks.setdefault(match.group(1), set()).add(int(match.group(2)))
    big = {path: len(indices) for path, indices in stacks.items() if len(indices) > 1}
    if len(big) != 1:
        raise UnsupportedError("pipeline stages over {count} layer stacks ({stacks}) are not modelled: one stack of "
                               "layers (a decoder or an encoder) is", count=len(big), stacks=", ".join(big) or "none")
    (path, count), = big.items()
    return path, count


def in_flight(layout: ParallelLayout, rank: int) -> int:
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    if layout.schedule == "gpipe":
        return m
    if layout.schedule == "1f1b":
        return min(m, p - rank)
    return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)


def interleaved_order(layout: ParallelLayout, rank: int) -> tuple[tuple[str, int], ...]:
    """Rank `rank`'s actions under the interleaved schedule, in order, each ("F" or "B", the rank's local chunk): torch's
    ScheduleInterleaved1F1B (its _get_warmup_ops and _get_1f1b_rank_ops, idle slots left out): rounds of
    m / max(1, m // pp) microbatches, (v − 1) rounds' forwards and 2 more for each rank before the last as warm-up,
    then one forward and one backward a step, forwards chunk by chunk round by round, backwards from the last chunk
    down; each chunk's microbatches in order (tests/test_interleaved_stages.py holds it to torch's own order)."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    per_round = m // max(1, m // p)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), total)
    order: list[tuple[str, int]] = []
    for step in range(total + warmup):
        if step < total:
            order.append(("F", (step // per_round) % v))
        if step >= warmup:
            order.append(("B", v - 1 - ((step - warmup) // per_round) % v))
    return tuple(order)


def layers_in_flight(layout: ParallelLayout, stage: Stage) -> tuple[int, int, int]:
    """The layer-microbatches `stage` holds along its schedule, each microbatch in flight counting its chunk's layers:
    (the most at once, the most at a moment of its last chunk's forward end or backward start, where the last
    stage's head runs, the most microbatches of its first chunk at once, each holding the embedding output on the
    first stage). GPipe and 1F1B: the stage's in-flight microbatches × its layers; interleaved: counted along
    interleaved_order, a forward's microbatch held from its end, a backward's to its start."""
    if layout.virtual_stages == 1:
        held = stage.in_flight * len(stage.layers)
        return held, held, stage.in_flight
    counts = [0] * len(stage.chunk_layers)
    most = head = first = 0
    for kind, chunk in interleaved_order(layout, stage.rank):
        if kind == "F":
            counts[chunk] += 1
        layers = sum(n * size for n, size in zip(counts, stage.chunk_layers))
        most, first = max(most, layers), max(first, counts[0])
        if chunk == len(counts) - 1:
            head = max(head, layers)
        if kind == "B":
            counts[chunk] -= 1
    return most, head, first


def bubble(layout: ParallelLayout) -> float:
    """The pipeline's idle fraction of a step: (pp − 1) / (v·m + pp − 1)."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


def stages(layout: ParallelLayout, layers: int) -> tuple[Stage, ...]:
    p, v = layout.pp, layout.virtual_stages
    chunks = p * v
    if layers < chunks and v == 1:
        raise OptionError("{0} {pp} is more than the model's {layers} layers", "pp", pp=p, layers=layers)
    if layers < chunks:
        raise OptionError("{0} × virtual stages = {chunks} chunks is more than the model's {layers} layers", "pp",
                          chunks=chunks, layers=layers)
    sizes = [layers // chunks + (1 if c < layers % chunks else 0) for c in range(chunks)]
    starts = [sum(sizes[:c]) for c in range(chunks)]
    out = []
    for rank in range(p):
        mine = [c for c in range(chunks) if c % p == rank]
        held = tuple(i for c in mine for i in range(starts[c], starts[c] + sizes[c]))
        out.append(Stage(rank, held, tuple(sizes[c] for c in mine), rank == 0, rank == p - 1,
                         in_flight(layout, rank)))
    return tuple(out)


def split_words(layout: ParallelLayout, layers: int) -> str:
    """How the layers are split, in words: "32 layers, 8 a stage" or the uneven split named."""
    chunks = layout.pp * layout.virtual_stages
    what = "chunk" if layout.virtual_stages > 1 else "stage"
    if layers % chunks == 0:
        return f"{layers} layers, {layers // chunks} a {what}"
    more = layers % chunks
    return (f"{layers} layers over {chunks} {what}s, uneven: the first {more} hold {layers // chunks + 1}, the "
            f"rest {layers // chunks}")

def after_layers(params: Any, stack: str) -> str:
    """What the last stage runs after its layers, from the roles of the parameters outside the layer stack and the
    embeddings: a decoder's 'the final norm and head', BERT's masked LM's 'the head', its classifier's 'the pooler and
    head'."""
    roles = {p.role for p in params if layer_of(p.name, stack) is None and not p.role.startswith("embeddings")}
    parts = [name for name, found in (("final norm", "norm.final" in roles), ("pooler", "pooler" in roles),
                                      ("head", any(r.startswith("head") for r in roles))) if found]
    if not parts:
        return "the final norm and head"
    return "the " + (" and ".join(parts) if len(parts) < 3 else f"{parts[0]}, {parts[1]} and {parts[2]}")

