"""The shape every recipe answers in: one family's closed forms at one precision, and the config reads they share.

A recipe returns a `Layout`, or a string naming what of the config it was not fitted for (the report says so and the
step is traced)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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




def config_dims(config: Any, **fields: str | tuple[str, ...]) -> tuple[int, ...] | str:
    """The config's positive integers for `fields` (name → its key, or keys tried in order), in that order; or,
    when any is unset, the words naming the first key of each missing one."""
    from ..kv_cache import config_int

    keys = {name: (key,) if isinstance(key, str) else key for name, key in fields.items()}
    values = {name: config_int(config, *names) for name, names in keys.items()}
    absent = [names[0] for name, names in keys.items() if values[name] is None]
    return "a config without " + ", ".join(absent) if absent else tuple(values.values())


def missing(**fields: Any) -> str:
    return "a config without " + ", ".join(name for name, value in fields.items() if value is None)




def attention_dropout(config: Any) -> float:
    """The attention-probability dropout a config sets for training (0 when none)."""
    return first_positive(config, ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout",
                                    "attention_dropout_prob", "dropout_rate"))  # T5: one rate for both


def hidden_dropout(config: Any) -> float:
    """The dropout on a layer's outputs a config sets for training (0 when none)."""
    return first_positive(config, ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout",
                                    "dropout_rate"))


def first_positive(config: Any, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 0.0
