"""Tower traces kept with the config's cost facts: the key of a trace (media_key), its JSON (to_json, and from_json,
which validates every field), and the entry read back (find_media) or written (keep_media)."""

from __future__ import annotations

from typing import Any

from .media import MAX_IMAGE_TOKENS, MAX_IMAGES, MediaFlops, MediaInput, TowerLine


FORMAT = 2  # 2: decoder_backward (training a cross-attention family)
_PARTS = ("vision tower", "projector", "audio encoder")
MAX_LINES = 8
MAX_MODULES = 100_000
MAX_WORDS = 2_000


def media_key(facts_key: str, media: MediaInput, *, batch: int, seq: int, training: bool,
              frozen: frozenset[str] = frozenset()) -> str:
    """The trace's key: the config's facts key and everything the trace depends on (the decoder's length only for
    Whisper, whose decoder is read off the same trace)."""
    import hashlib

    audio = media.audio_seconds is not None
    spec = json_dumps({"config": facts_key, "image_tokens": media.image_tokens, "images": media.images,
                       "audio_seconds": media.audio_seconds, "batch": batch, "seq": seq if audio else None,
                       "training": training, "frozen": sorted(frozen) if training else []})
    return hashlib.sha256(spec.encode()).hexdigest()[:32]


def json_dumps(data: Any) -> str:
    import json

    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def to_json(media: MediaFlops) -> dict[str, Any]:
    return {"kind": media.kind, "input": media.input_words, "per_sequence": media.per_sequence, "tokens": media.tokens,
            "tokens_from": media.tokens_words, "engine": media.engine, "notes": list(media.notes),
            "lines": [[line.part, line.path, line.class_name, line.forward, line.backward] for line in media.lines],
            "decoder": [[path, flops] for path, flops in media.decoder_by_module],
            "decoder_backward": media.decoder_backward}


def from_json(data: Any) -> MediaFlops:
    """A kept trace, validated field by field (CacheEntryError for anything else)."""
    from ...disk_cache import expect, is_int
    from ..engine_check import printable

    expect(isinstance(data, dict) and set(data) == {"kind", "input", "per_sequence", "tokens", "tokens_from",
                                                    "engine", "notes", "lines", "decoder", "decoder_backward"},
           "not a tower trace")
    expect(data["kind"] in ("image", "audio") and data["engine"] == "traced", "unknown kind or engine")
    for name in ("per_sequence", "tokens"):
        expect(is_int(data[name]) and 0 <= data[name] <= MAX_IMAGE_TOKENS * MAX_IMAGES, f"bad {name}")
    words = [data["input"], data["tokens_from"], *(data["notes"] if isinstance(data["notes"], list) else [None])]
    expect(all(isinstance(w, str) and len(w) <= MAX_WORDS and printable(w) == w for w in words), "bad words")
    expect(isinstance(data["lines"], list) and 1 <= len(data["lines"]) <= MAX_LINES, "bad lines")
    lines = []
    for line in data["lines"]:
        expect(isinstance(line, list) and len(line) == 5 and line[0] in _PARTS, "bad line")
        part, path, class_name, forward, backward = line
        expect(all(isinstance(s, str) and len(s) <= MAX_WORDS and printable(s) == s for s in (path, class_name)),
               "bad path")
        expect(is_int(forward) and forward >= 0 and (backward is None or is_int(backward) and backward >= 0),
               "bad FLOPs")
        lines.append(TowerLine(part, path, class_name, forward, backward))
    expect(isinstance(data["decoder"], list) and len(data["decoder"]) <= MAX_MODULES, "bad decoder")
    decoder = []
    for item in data["decoder"]:
        expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) <= MAX_WORDS
               and is_int(item[1]) and item[1] >= 0, "bad decoder module")
        decoder.append((item[0], item[1]))
    rest = data["decoder_backward"]
    expect(rest is None or is_int(rest) and rest >= 0, "bad decoder backward")
    return MediaFlops(data["kind"], data["input"], data["per_sequence"], data["tokens"], data["tokens_from"],
                      tuple(lines), notes=tuple(data["notes"]), decoder_by_module=tuple(decoder), decoder_backward=rest)


def _entry(class_name: str, key: str) -> Any:
    from ...disk_cache import class_directory, installed_transformers_version, safe_name
    from ...template import cache_directory
    from ..facts.store import facts_directory

    version = installed_transformers_version()
    if version is None:
        return None
    return facts_directory(class_directory(cache_directory(version), class_name)) / f"{safe_name(key)}.towers.json"


def find_media(class_name: str, key: str) -> MediaFlops | None:
    """The tower trace kept for this class and key by these versions, or None."""
    from ...disk_cache import CacheEntryError, expect, read_entry, versions

    path = _entry(class_name, key)
    if path is None:
        return None
    try:
        data = read_entry(path)
        expect(isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key
               and data.get("class") == class_name and data.get("versions") == versions(), "not this trace")
        return from_json(data.get("media"))
    except (CacheEntryError, OSError):
        return None


def keep_media(media: MediaFlops, class_name: str, key: str) -> None:
    from ...disk_cache import versions, write_entry

    path = _entry(class_name, key)
    if path is not None:
        write_entry(path, {"format": FORMAT, "key": key, "class": class_name, "versions": versions(),
                           "media": to_json(media)})
