"""The serving correction kept on disk: where a config's analytic serving peak differs from a traced prefill, the
difference at the asked point (serving_check.extended_difference: two cuts traced) is kept, so the next question at
that point is answered from the cost facts, without the build or the traces (each took 10-30 s on an MoE).

An entry is bound to what made it, as derived recipes are (cost/derived/store.py): the class, the config's facts key
(its whole snapshot, hashed), the compute dtype, the point (batch, length, encoder length) and the versions of
paramscope (with its source's fingerprint), torch and transformers (disk_cache.versions), all in the key's hash;
the key, the class and the versions are repeated in the entry and must be equal before it is read, through
disk_cache's bounded reader. The entry keeps what was measured (each cut's length and difference), not the answer:
the difference and its words are derived from them again (CutDifference), so an entry cannot say a difference its
measurements do not give. An entry that does not match is measured again.

Where the two cuts disagree (what the analytic engine misses grows with depth), the whole model is traced at the
point, and that is kept too (`whole`: analytic − traced on every layer, with the traced peak's phase and the trace's
own notes), so the next question at that point is answered from the facts as the agreeing case is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...disk_cache import CacheEntryError, cache_root, entry_path, expect, is_int, read_entry, versions, write_entry

FORMAT = 2  # 2: the whole model's trace kept where the cuts disagree
MAX_BYTES = 1 << 50  # a difference beyond a petabyte is no measurement
MAX_LAYERS = 1 << 16
PHASES = ("prefill", "decode")  # traced_serving's phases (traced/step.trace_inference)
MAX_NOTES, MAX_NOTE = 32, 2000  # the trace's own notes: a few sentences
_FIELDS = {"batch", "seq", "short", "first", "count", "long", "second", "whole", "phase", "notes"}


@dataclass(frozen=True)
class CutDifference:
    """analytic − traced serving peak at B × S, on the check's cut (`short` layers) and, unless the cut is the whole
    model (`count` layers), on one twice as long (`long`); where those two disagree, on the whole model (`whole`,
    the traced peak's `phase` and the trace's `notes`)."""

    batch: int
    seq: int
    short: int
    first: int
    count: int
    long: int | None = None
    second: int | None = None
    whole: int | None = None
    phase: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def grows(self) -> bool:
        """The two cuts disagree: what the analytic engine misses grows with depth."""
        return self.short != self.count and self.first != self.second

    @property
    def traced_whole(self) -> bool:
        """The answer is the whole model's trace (the cuts disagreed, and it was traced)."""
        return self.grows and self.whole is not None

    @property
    def difference(self) -> int | None:
        """The correction at B × S: the cuts' difference where it does not grow with depth, else the whole model's
        trace's; None where it grows and the whole model was not traced."""
        if self.short == self.count:
            return self.first
        return self.first if self.first == self.second else self.whole

    def words(self) -> str:
        if self.short == self.count:
            return (f"at B={self.batch}, S={self.seq:,} the analytic peak is {self.first:+,} B from the whole model's "
                    "trace")
        cuts = (f"at B={self.batch}, S={self.seq:,} the analytic peak is {self.first:+,} B from the traced one on "
                f"{self.short} layers and {self.second:+,} B on {self.long}")
        if not self.traced_whole:
            return cuts
        return (f"{cuts}: it grows with depth, so the whole model was traced ({self.count} layers, its peak in the "
                f"{self.phase}): {self.whole:+,} B")

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "seq": self.seq, "short": self.short, "first": self.first, "count": self.count,
                "long": self.long, "second": self.second, "whole": self.whole, "phase": self.phase,
                "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: Any) -> "CutDifference":
        """Every field checked: a cache entry is read, never trusted."""
        expect(isinstance(data, dict) and set(data) == _FIELDS, "not a cut difference")
        for name in ("batch", "seq"):
            expect(is_int(data[name]) and 1 <= data[name] <= 1 << 24, f"{name} is out of bounds")
        for name in ("short", "count"):
            expect(is_int(data[name]) and 1 <= data[name] <= MAX_LAYERS, f"{name} is not a layer count")
        expect(data["short"] <= data["count"], "the cut is longer than the model")
        expect(is_int(data["first"]) and abs(data["first"]) <= MAX_BYTES, "first is not a byte difference")
        entire = data["short"] == data["count"]  # the check's cut was the whole model
        if entire:
            expect(data["long"] is None and data["second"] is None, "a whole-model trace has no second cut")
        else:
            expect(is_int(data["long"]) and data["short"] < data["long"] <= data["count"],
                   "long is not a longer cut's layer count")
            expect(is_int(data["second"]) and abs(data["second"]) <= MAX_BYTES, "second is not a byte difference")
        grows = not entire and data["first"] != data["second"]
        if grows:  # the whole model traced: its difference, its phase and its notes
            expect(is_int(data["whole"]) and abs(data["whole"]) <= MAX_BYTES, "whole is not a byte difference")
            expect(data["phase"] in PHASES, "phase is not a traced phase")
            notes = data["notes"]
            expect(isinstance(notes, list) and len(notes) <= MAX_NOTES
                   and all(isinstance(n, str) and 0 < len(n) <= MAX_NOTE and n.isprintable() for n in notes),
                   "notes are not a few printable sentences")
        else:  # the cuts agree (or are the model): nothing else was traced
            expect(data["whole"] is None and data["phase"] is None and data["notes"] == [],
                   "a whole-model trace where the cuts agree")
        return cls(data["batch"], data["seq"], data["short"], data["first"], data["count"], data["long"],
                   data["second"], data["whole"], data["phase"], tuple(data["notes"]))


def correction_key(class_name: str, config_key: str, dtype: str, batch: int, seq: int,
                   encoder_seq: int | None) -> str:
    """The entry's key: what the difference was measured for, and the versions that measured it, hashed."""
    payload = {"class": class_name, "config": config_key, "dtype": dtype, "batch": batch, "seq": seq,
               "encoder_seq": encoder_seq, "versions": versions()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _path(class_name: str, key: str) -> Path:
    return entry_path(cache_root() / f"serving-corrections-v{FORMAT}", class_name, key)


def find_difference(class_name: str, key: str, batch: int, seq: int) -> CutDifference | None:
    """The kept difference for `key`, or None where none is kept, or the entry is unreadable, malformed, made by
    other versions or for another point."""
    try:
        data = read_entry(_path(class_name, key))
        expect(isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key
               and data.get("class") == class_name, "not a correction for this key")
        expect(data.get("versions") == versions(), "made by other versions")
        found = CutDifference.from_json(data.get("difference"))
        expect((found.batch, found.seq) == (batch, seq), "measured at another point")
    except (CacheEntryError, OSError):
        return None
    return found


def keep_difference(class_name: str, key: str, found: CutDifference) -> Path | None:
    return write_entry(_path(class_name, key), {"format": FORMAT, "key": key, "class": class_name,
                                                "versions": versions(), "difference": found.to_json()})


@dataclass(frozen=True)
class CorrectionFor:
    """One config's serving correction in one compute dtype: kept (`use_cache`), else measured on the build's module
    (`measure(module, dtype, batch, seq, encoder_seq)` → CutDifference) and kept."""

    config_key: str
    use_cache: bool
    measure: Any

    def __call__(self, view: Any, dtype: str, batch: int, seq: int, encoder_seq: int | None) -> CutDifference:
        """What was measured at B × S (its `difference`, the correction; `traced_whole`: the whole model's trace,
        where the cuts disagree; `words()`). FactsGap where none is kept and `view` has no module to trace."""
        from ..model_view import FactsGap

        key = correction_key(view.class_name, self.config_key, dtype, batch, seq, encoder_seq)
        found = find_difference(view.class_name, key, batch, seq) if self.use_cache else None
        if found is None:
            if view.module is None:
                raise FactsGap("the analytic serving peak differs from a traced prefill for this config (checked "
                               "once): the build traces two cuts (and the whole model where they disagree)")
            found = self.measure(view.module, dtype, batch, seq, encoder_seq)
            if self.use_cache:  # --no-cache neither answers from nor records
                keep_difference(view.class_name, key, found)
        return found


__all__ = ["CorrectionFor", "CutDifference", "correction_key", "find_difference", "keep_difference"]
