"""The settings the memory figures depend on, in words: the precisions' meanings and the page's settings rows. Pure
functions of their data."""

from __future__ import annotations

from typing import Any

from ..explain import exact
from .memory_cells import binary, short_dtype


PRECISIONS = {"fp32": "fp32 weights, gradients and optimizer states",
               "bf16-mixed": "fp32 weights (the master copy), bf16 autocast",
               "fp16-mixed": "fp32 weights (the master copy), fp16 autocast",
               "bf16-pure": "bf16 weights, gradients and optimizer states",
               "bf16-master": "bf16 weights and gradients, fp32 master weights and optimizer states (DeepSpeed's "
                              "bf16 / the ZeRO paper's mixed precision)",
               "bf16-main-grad": "bf16 weights, an fp32 main-gradient buffer, fp32 master weights and optimizer "
                                 "states (Megatron-LM's bf16 training)"}


def settings_rows(memory: dict[str, Any]) -> list[tuple[str, str]]:
    """Every setting the figures depend on, as (setting, value) in words, from the JSON "memory" object: what
    the text says in its header and convention lines, for the page to list."""
    settings = memory["settings"]
    engine = memory["engine"] + " engine, allocator level (bytes of tensors)"
    training = memory["mode"] == "training"
    seq_from = "" if settings["seq_from"] == "--seq" else " (default for training)" if training else \
        f" ({settings['seq_from']})"  # as the text's header says it
    shape = f"{settings['batch']:,} × {settings['seq']:,} tokens{seq_from}"
    reserve = (f"{binary(settings['reserve'])} (--reserve): CUDA context and allocator fragmentation, added to the "
               "peak before comparing with a device")
    if not training:
        cache = memory["kv_cache"]
        if cache is None:
            kv = "none: the model does not generate"
        else:
            kv = f"{short_dtype(cache['dtype'])}, {cache['layout']} layout"
            encoder = [g["tokens"] for g in cache["groups"] if g["kind"] == "cross-attention"]
            if encoder:
                kv += f"; cross-attention holds {encoder[0]:,} encoder tokens"
        return [("engine", engine),
                ("weights", f"{memory['weights']['format_label']}, from {settings['dtype_from']}"),
                *([("compute dtype", short_dtype(settings["compute_dtype"]))] if settings.get("compute_dtype") else []),
                ("KV cache", kv),
                ("batch × sequence", shape),
                ("reserve", reserve)]
    if settings.get("trace"):
        engine += f"; --trace {settings['trace']}"
    own = ", ".join(f"{exact(n)} parameters kept in {short_dtype(d)}"
                    for d, n in (settings.get("own_dtype") or {}).items())
    frozen = ", ".join(settings["freeze"]) or "nothing"
    if memory.get("frozen_parameters"):
        frozen += (f" ({exact(memory['frozen_parameters'])} parameters; {exact(memory['trainable_parameters'])} "
                   "train)")
    devices = (f"{settings['devices']:,}, data parallel, each with its own batch; ZeRO-{settings['zero']}"
               if settings["devices"] > 1 or str(settings["zero"]) != "0" else "1, no sharding (ZeRO-0)")
    return [("engine", engine),
            ("precision", f"{settings['precision']}: {PRECISIONS[settings['precision']]}"),
            ("weights dtype", short_dtype(settings["weights_dtype"]) + (f"; {own}" if own else "")),
            ("optimizer", settings["optimizer"] + (" (fused)" if settings["optimizer"] in ("adamw", "adam") else "")),
            ("batch × sequence", shape),
            ("attention", settings["attention"]),
            ("gradient checkpointing", settings["grad_checkpointing"]),
            ("activations", settings["activations_from"]),
            ("frozen", frozen),
            ("devices", devices),
            ("reserve", reserve)]
