"""The shape every recipe answers in: one family's closed forms at one precision, and the config reads they share.

A recipe returns a `Layout`, or a string naming what of the config it was not fitted for (the report says so and the
step is traced)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """One family's closed forms at one precision: bytes and arithmetic, per layer and outside the layers."""

    layer: int  # a whole layer's saved bytes at this batch and length, without checkpointing
    layer_text: str
    outside: int
    outside_text: str
    hidden: int
    vocab: int
    layers: int
    loss_tv: tuple[int, int] = (0, 0)  # (end of forward, start of backward) extra ·T·V; (0, 0): the usual
    # with checkpointing, (bytes, arithmetic) outside the layers where the arguments the layers are recomputed from
    # (masks, position biases) change them; None: as without
    checkpointed_outside: tuple[int, str] | None = None
    stack: tuple[int, str] | None = None  # (bytes, arithmetic) of all the layers when they differ (encoder-decoders)
    checkpointing: bool = True  # fitted with gradient checkpointing too


