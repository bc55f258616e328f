"""Derived recipes kept on disk, so that a config's next question (another batch, another length, another run)
is answered without a trace, and without torch when its template and cost facts are kept too.

An entry is bound to what made it: the class, the config (its whole snapshot), the step's settings, the regime,
and the versions of paramscope, torch and transformers (disk_cache.versions), all in the key's hash; the key, the
class and the versions are repeated in the entry and must be equal before it is read, through disk_cache's bounded
reader, every field checked (recipe.recipe_from_json). An entry that does not match is derived again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ...disk_cache import CacheEntryError, cache_root, entry_path, read_entry, versions, write_entry
from .recipe import DerivedRecipe, recipe_from_json, recipe_to_json

# 2: a layer's type includes its parameters' trainability (v1 recipes of plans that froze layers beyond the cut
# extended the cut's trainable layers over them: never read again)
# 3: a fake wait_tensor's output is the tensor it waited on (v2 counted a tensor-parallel all-reduce's output twice);
# recipes carry their sequence unit (sequence parallel: sizes in S / tp)
# 4: a composite model is built wholly in the asked dtype (v3 recipes of Qwen2.5-VL and other composite classes were
# traced with the language model in its sub-config's dtype: bf16 weights under bf16-mixed, so no autocast copies)
FORMAT = 4


def recipe_key(class_name: str, config: Any, settings: Any, batch: int, seq_range: tuple[int, int],
               structure: str | None = None) -> str:
    from ..facts.store import snapshot_of

    payload = {
        "class": class_name, "config": snapshot_of(config),
        "settings": {"precision": settings.precision, "attention": settings.attention,
                     "frozen": sorted(settings.frozen), "weights_dtype": settings.weights_dtype,
                     "own_dtype": sorted(settings.own_dtype), "checkpointing": bool(settings.grad_checkpointing),
                     **({"layout": list(settings.layout)} if getattr(settings, "layout", None) else {})},
        "batch": "1" if batch == 1 else "2+", "seq_range": list(seq_range), "structure": structure,
        "versions": versions(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _path(class_name: str, key: str) -> Path:
    return entry_path(cache_root() / f"derived-v{FORMAT}", class_name, key)


def find_recipe(class_name: str, key: str) -> DerivedRecipe | None:
    try:
        data = read_entry(_path(class_name, key))
        if (not isinstance(data, dict) or data.get("key") != key or data.get("class") != class_name
                or data.get("versions") != versions()):
            return None
        return recipe_from_json(data.get("recipe"))
    except (CacheEntryError, OSError):
        return None


def keep_recipe(class_name: str, key: str, recipe: DerivedRecipe) -> Path | None:
    return write_entry(_path(class_name, key), {"key": key, "class": class_name, "versions": versions(),
                                                "recipe": recipe_to_json(recipe)})
