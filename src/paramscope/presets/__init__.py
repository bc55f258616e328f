"""Embedded presets: real config.json files of well-known models, named by hub id with short aliases.

The registry is plain JSON so that looking a preset up never imports torch or transformers.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import SourceError
from ..frozen import FrozenDict, freeze_fields

_REGISTRY_FILES = ("registry.json", "registry_extra.json")


@dataclass(frozen=True)
class Preset:
    name: str  # the hub id, e.g. "google-bert/bert-base-uncased"
    aliases: tuple[str, ...]
    config_file: str
    published: FrozenDict[str, Any] | None = field(default=None, compare=False)  # figures the model card gives

    def __post_init__(self) -> None:
        freeze_fields(self, "published")

    def load_config(self) -> dict[str, Any]:
        text = resources.files(__name__).joinpath("configs", self.config_file).read_text("utf-8")
        return json.loads(text)


@lru_cache(maxsize=1)
def all_presets() -> tuple[Preset, ...]:
    presets = []
    root = resources.files(__name__)
    for filename in _REGISTRY_FILES:
        entry_file = root.joinpath(filename)
        if not entry_file.is_file():
            continue
        for entry in json.loads(entry_file.read_text("utf-8")):
            presets.append(
                Preset(
                    name=entry["name"],
                    aliases=tuple(entry.get("aliases", ())),
                    config_file=entry["config"],
                    published=entry.get("published"),
                )
            )
    return tuple(presets)


@lru_cache(maxsize=1)
def _index() -> dict[str, Preset]:
    index: dict[str, Preset] = {}
    for preset in all_presets():
        for key in (preset.name, *preset.aliases):
            index[key.lower()] = preset
        # "bert-base-uncased" also finds "google-bert/bert-base-uncased"
        index.setdefault(preset.name.split("/")[-1].lower(), preset)
    return index


def find_preset(name: str) -> Preset | None:
    """The preset called `name` (hub id, alias or bare repo name, any case), or None."""
    return _index().get(name.strip().lower())


@lru_cache(maxsize=1)
def _spellings() -> dict[str, str]:
    """Every name a preset answers to, lower-cased → as the registry spells it."""
    spellings: dict[str, str] = {}
    for preset in all_presets():
        for name in (preset.name, *preset.aliases, preset.name.split("/")[-1]):
            spellings.setdefault(name.lower(), name)
    return spellings


def close_preset_names(name: str, limit: int = 3) -> list[str]:
    """Preset names (hub ids or aliases) close to a misspelled `name`, closest first: "bert-base-uncasd" →
    ["bert-base-uncased"]. Empty when nothing is close or `name` is too long to be a misspelling of one."""
    key = str(name).strip().lower()
    if not key or len(key) > 200:
        return []
    spellings = _spellings()
    scored = sorted(((difflib.SequenceMatcher(None, key, other).ratio(), other) for other in spellings),
                    reverse=True)
    best = scored[0][0] if scored else 0.0
    found: list[str] = []
    for ratio, match in scored:
        if ratio < 0.8 or ratio < best - 0.03:  # only the closest: a near tie is shown, a distant second is not
            break
        preset = find_preset(match)
        if all(find_preset(f) is not preset for f in found):  # one spelling per preset
            found.append(spellings[match])
    return found[:limit]


def did_you_mean(names: list[str]) -> str:
    """"did you mean 'a' or 'b'?" for a message, or "" when there is nothing to suggest."""
    if not names:
        return ""
    return "did you mean " + " or ".join(repr(n) for n in names) + "?"


def presets_named(names: list[str] | None) -> list[Preset]:
    """The presets `names` name (all of them for None or none given); SourceError naming one that is no preset."""
    if not names:
        return list(all_presets())
    found = []
    for name in names:
        preset = find_preset(name)
        if preset is None:
            hint = did_you_mean(close_preset_names(name))
            raise SourceError(f"no preset named {name!r}" + (f"; {hint}" if hint else "") + " (see `paramscope presets`)")
        found.append(preset)
    return found


def preset_names() -> list[str]:
    return sorted(p.name for p in all_presets())
