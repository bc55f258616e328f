"""What a plan's step cost, kept on disk, so that the same plan asked again is answered without torch: the plan's key
(its config, class and options: what decides the planned module without building it), under which its derived
memory recipes are kept (derived/store.py), and its traced FLOPs at each batch, length and checkpointing asked.

An entry is bound to what made it (the key's hash holds the config snapshot, the class, every plan option and the
versions of paramscope, torch, transformers and PEFT: disk_cache.versions("peft"), repeated in the entry with the
key and the class, all equal before it is read) and read through disk_cache's bounded reader, every field checked.
Torch-free: nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from .disk_cache import CacheEntryError, cache_root, entry_path, expect, is_int, read_entry, versions, write_entry

FORMAT = 1
PLANS = "plans"  # the entries' class directory: a plan key already holds the class
MAX_MODULES = 1 << 16  # entries of a by-module FLOP table: a model's modules, a few thousand


def plan_key(config: dict[str, Any], class_name: str, options: Any, num_labels: int | None = None) -> str:
    """The key of `options` (plan.PlanOptions) applied to `class_name` built from `config`: the dict as read, which
    the build and the template's stand-ins both start from."""
    payload = {"config": json.loads(json.dumps(config, sort_keys=True, default=str)), "class": class_name,
               "num_labels": num_labels,
               "options": dataclasses.asdict(options),
               "versions": versions("peft")}
    return "plan-" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _path(class_name: str, key: str) -> Path:
    return entry_path(cache_root() / f"plan-flops-v{FORMAT}", class_name, key)


def _point(batch: int, seq: int, checkpointing: bool) -> str:
    return f"{batch}x{seq}{'-checkpointed' if checkpointing else ''}"


def find_flops(class_name: str, key: str, *, batch: int, seq: int, checkpointing: bool) -> Any:
    """The plan's traced FLOPs at that point (traced/flops.TracedFlops), or None."""
    try:
        data = read_entry(_path(class_name, key))
        if (not isinstance(data, dict) or data.get("key") != key or data.get("class") != class_name
                or data.get("versions") != versions("peft")):
            return None
        points = data.get("points")
        expect(isinstance(points, dict) and len(points) <= 4096, "points")
        found = points.get(_point(batch, seq, checkpointing))
        return None if found is None else flops_from_json(found)
    except (CacheEntryError, OSError):
        return None


def keep_flops(class_name: str, key: str, flops: Any, *, batch: int, seq: int, checkpointing: bool) -> Path | None:
    path = _path(class_name, key)
    points: dict[str, Any] = {}
    try:
        data = read_entry(path)
        if (isinstance(data, dict) and data.get("key") == key and data.get("versions") == versions("peft")
                and isinstance(data.get("points"), dict)):
            points = dict(list(data["points"].items())[-1000:])  # the newest points, bounded
    except (CacheEntryError, OSError):
        pass
    points[_point(batch, seq, checkpointing)] = flops_to_json(flops)
    return write_entry(path, {"key": key, "class": class_name, "versions": versions("peft"), "points": points})


def flops_to_json(flops: Any) -> dict[str, Any]:
    return {"forward": flops.forward, "backward": flops.backward,
            "forward_by_module": dict(flops.forward_by_module), "backward_by_module": dict(flops.backward_by_module),
            "fused_attention_forward": flops.fused_attention_forward,
            "fused_attention_backward": flops.fused_attention_backward,
            "backward_without_checkpointing": flops.backward_without_checkpointing}


def flops_from_json(data: Any) -> Any:
    """TracedFlops from `data`, every field checked (CacheEntryError names the first that is wrong)."""
    from .cost.traced.flops import TracedFlops

    expect(isinstance(data, dict), "flops: an object")

    def count(name: str, optional: bool = False) -> int | None:
        value = data.get(name)
        if optional and value is None:
            return None
        expect(is_int(value) and 0 <= value < 1 << 80, f"flops.{name}: a count")
        return value

    def table(name: str) -> dict[str, int]:
        value = data.get(name)
        expect(isinstance(value, dict) and len(value) <= MAX_MODULES and all(
            isinstance(k, str) and len(k) <= 1000 and is_int(v) and abs(v) < 1 << 80 for k, v in value.items()),
            f"flops.{name}: module → count")
        return value

    return TracedFlops(count("forward"), count("backward", optional=True), table("forward_by_module"),
                       table("backward_by_module"), count("fused_attention_forward"),
                       count("fused_attention_backward"), count("backward_without_checkpointing", optional=True))
