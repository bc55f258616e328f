"""Check before trusting: an instant engine's answer held against the traced engine on a short cut of the real class,
once per config, and the outcome kept beside the config's cost facts.

    the built module (meta) → a cut holding the first layer of each type (each stack of an encoder-decoder; the
    whole model where no stack is found) → at two (B, S) points and one long sequence, the instant answer for the
    cut against the trace of the cut (flops/check.py: FlopCounterMode; memory/serving_check.py: MemTracker) →
    EngineCheck (equal, differs with where, or unchecked with why) → kept at
    <templates>/<class>/costs/<key>.<quantity>-check.json (the package's for the presets, else the user's cache)

The figures are polynomials in B and S (a FLOP count: weights × B·S, attention × B·S², poolers × B; a prefill's
memory: activations × B·S, masks × S²), so two points with different B and S whose values no config integer shares
tell every term apart, and a long sequence catches a change of regime (an implementation that stops computing the
full S² past some length). The instant engine answers from then on when they agree; when they do not, the traced
engine answers and the report names where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..disk_cache import CacheEntryError, class_directory, expect, installed_transformers_version, read_entry, \
    safe_name, versions, write_entry

FORMAT = 1
LONG_SEQ = 32_768  # the long point: the model's context, at most this (fake tensors: the length costs nothing)
STATUSES = ("equal", "differs", "unchecked")
MAX_WORDS = 2_000
# the config fields that count an encoder's or a decoder's layers, beside the decoder-only ones
STACK_KEYS = ("encoder_layers", "decoder_layers", "num_decoder_layers")
# quantity → (what the instant engine gives, what the trace gives it by, the trace's modes)
QUANTITIES = {
    "flops": ("the analytic count", "FlopCounterMode's on fake tensors",
              ("forward", "training step", "checkpointed step")),
    "generation": ("the analytic generate() count", "FlopCounterMode's on fake tensors", ("prefill", "decode steps")),
    "serving": ("the analytic serving peak", "the traced one (generate()'s prefill and a decode step, MemTracker on "
                "fake tensors, to the byte)", ("float32", "bfloat16", "float16")),
}


@dataclass(frozen=True)
class EngineCheck:
    """The instant answer for a cut of `class_name` against the traced one, at `points` (B, S)."""

    quantity: str  # of QUANTITIES
    class_name: str
    status: str  # "equal" | "differs" | "unchecked" (the traced engine cannot run the class)
    layers: int  # the cut's repeated layers
    of_layers: int  # the model's (equal to layers: the whole model was traced)
    points: tuple[tuple[int, int], ...]
    modes: tuple[str, ...]  # what was checked at each point: the FLOP count's passes, the memory's compute dtype
    differs: str = ""  # where they first differ, or why not checked, in words ("" when equal)

    @property
    def agree(self) -> bool:
        return self.status == "equal"

    def where(self) -> str:
        cut = "the whole model" if self.layers == self.of_layers else \
            f"a {self.layers}-of-{self.of_layers}-layer cut of {self.class_name}"
        points = ", ".join(f"B={b} S={s:,}" for b, s in self.points)
        return f"{cut} at {points} ({', '.join(self.modes)})"

    def words(self) -> str:
        answer, traced, _ = QUANTITIES[self.quantity]
        if self.agree:
            return f"checked once for this config: {answer} equals {traced} on {self.where()}; answered analytically"
        if self.status == "unchecked":
            return f"unchecked: {self.differs}; so {answer} is given without a check"
        return f"{answer} differs from {traced} on {self.where()}: {self.differs}"

    def to_json(self) -> dict[str, Any]:
        return {"quantity": self.quantity, "class": self.class_name, "status": self.status, "layers": self.layers,
                "of_layers": self.of_layers, "points": [list(p) for p in self.points], "modes": list(self.modes),
                "differs": self.differs}

    @classmethod
    def from_json(cls, data: Any) -> "EngineCheck":
        """Every field checked: a cache entry is read, never trusted."""
        expect(isinstance(data, dict) and set(data) == {"quantity", "class", "status", "layers", "of_layers",
                                                        "points", "modes", "differs"}, "not an engine check")
        expect(data["quantity"] in QUANTITIES, "an unknown quantity")
        expect(isinstance(data["class"], str) and data["status"] in STATUSES, "class or status malformed")
        for name in ("layers", "of_layers"):
            expect(type(data[name]) is int and 0 <= data[name] <= 1 << 16, f"{name} is not a layer count")
        expect(data["layers"] <= data["of_layers"], "the cut is longer than the model")
        points = data["points"]
        expect(isinstance(points, list) and 1 <= len(points) <= 8 and all(
            isinstance(p, list) and len(p) == 2 and all(type(v) is int and 1 <= v <= 1 << 24 for v in p)
            for p in points), "points are not (B, S) pairs")
        modes = QUANTITIES[data["quantity"]][2]
        expect(isinstance(data["modes"], list) and data["modes"] and all(m in modes for m in data["modes"]),
               "modes are not checked modes")
        differs = data["differs"]
        expect(isinstance(differs, str) and len(differs) <= MAX_WORDS and differs.isprintable()
               and bool(differs) == (data["status"] != "equal"), "differs is malformed")
        return cls(data["quantity"], data["class"], data["status"], data["layers"], data["of_layers"],
                   tuple((b, s) for b, s in points), tuple(data["modes"]), differs)


def printable(words: str) -> str:
    """`words` as a kept check holds them: printable, at most MAX_WORDS characters."""
    return "".join(c if c.isprintable() else " " for c in words)[:MAX_WORDS]


def run_check(quantity: str, module: Any, compare: Any, *, doing: str, depth: int, count: int,
              points: list[tuple[int, int]], modes: tuple[str, ...]) -> EngineCheck:
    """The check of `quantity` for `module`: `compare()` says where the instant answer first differs from the trace
    ("" where it never does), under a progress line naming `doing`; a trace that cannot run the class makes the
    check "unchecked", with why."""
    from .. import progress
    from ..errors import UnsupportedError

    name = type(module).__name__
    status = "differs"
    with progress.status(f"checking {doing} on {depth} layers of {name}"):
        try:
            differs = compare()
        except UnsupportedError as err:  # the traced step cannot feed the class (an audio or image model)
            status, differs = "unchecked", f"the trace cannot run {name}: {err}"
        except Exception as err:  # broad on purpose: a class the fake-tensor trace cannot run is answered unchecked,
            # and says why, rather than not at all
            status, differs = "unchecked", f"the trace of {name} failed: {type(err).__name__}: {err}"
    if not differs:
        status = "equal"
    return EngineCheck(quantity, name, status, depth, count, tuple(points), tuple(modes), printable(differs))


# ------------------------------------------------------------------------------------------ the cut and points


def check_cut(module: Any, *, longer: bool = False) -> tuple[Any, int, int]:
    """(the cut, its repeated layers, the model's): each layer stack (an encoder-decoder has two) cut to the first
    layer of each of its types, two at least, so that what passes between layers shows; the whole model where no
    stack is found (ALBERT's shared groups). `longer`: twice as many layers (up to the model's), for telling what
    grows with depth."""
    import torch

    from .derived.derive import LAYER_COUNT_KEYS, cut_module, layer_types
    from .dims import config_int, text_config

    text = text_config(getattr(module, "config", None))
    counts = {config_int(text, key) for key in (*LAYER_COUNT_KEYS, *STACK_KEYS)} - {None} if text is not None \
        else set()
    lists = [(name, len(sub)) for name, sub in module.named_modules()
             if name and isinstance(sub, torch.nn.ModuleList) and len(sub) in counts]
    stacks = [(name, count) for name, count in lists if not any(name.startswith(other + ".") for other, _ in lists)]
    cut, depth, total = module, 0, 0
    for path, count in stacks:
        types = layer_types(cut.get_submodule(path))
        layers = max(max(types.index(t) for t in types) + 1, min(2, count))
        layers = min(count, 2 * layers) if longer else layers
        if layers < count:
            cut = cut_module(cut, path, layers)
            if len(stacks) > 1:  # an encoder's or a decoder's own count (cut_module sets the decoder-only names)
                _set_stack_count(text_config(cut.config), path, count, layers)
        depth, total = depth + layers, total + count
    return cut, depth, total


def _set_stack_count(config: Any, path: str, count: int, layers: int) -> None:
    from .dims import config_int

    decoder = "decoder" in path
    for key in STACK_KEYS:
        if ("decoder" in key) == decoder and config_int(config, key) == count:
            setattr(config, key, layers)


def check_points(module: Any) -> list[tuple[int, int]]:
    """Two (B, S) with B of 3 and 2 and prime lengths no config integer is near, and (1, the model's context up to
    LONG_SEQ) when that is longer."""
    from .derived.derive import MAX_BATCH, config_integers, sample_points
    from .dims import max_context, text_config

    limit = max_context(text_config(module.config)) or LONG_SEQ
    (b1, s1), (b2, s2) = sample_points((2, max(limit, 3)), config_integers(module.config), (2, MAX_BATCH))
    points = [(b1, s1), (b2, s2)]
    long = min(limit, LONG_SEQ)
    if long > max(s1, s2):
        points.append((1, long))
    return points


# ------------------------------------------------------------------------------------------------- the store


def _name(quantity: str, key: str) -> str:
    return f"{safe_name(key)}.{quantity}-check.json"


def find_check(quantity: str, class_name: str, key: str) -> EngineCheck | None:
    """The check kept for `key`: the package's (the presets'), else the user cache's; None when neither holds one
    for this class and these versions."""
    from ..template import cache_directory, shipped_directory

    version = installed_transformers_version()
    if version is None:
        return None
    for root, bound in ((shipped_directory(version), False), (cache_directory(version), True)):
        found = read_check(quantity, root, class_name, key, bound=bound)
        if found is not None:
            return found
    return None


def read_check(quantity: str, root: Path, class_name: str, key: str, *, bound: bool) -> EngineCheck | None:
    """The check in templates root `root`, or None. `bound`: the entry must have been made by these versions (the
    user cache's are; the package's are the package's)."""
    from .facts.store import facts_directory

    try:
        data = read_entry(facts_directory(class_directory(root, class_name)) / _name(quantity, key))
        expect(isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key,
               "not a check for this key")
        expect(not bound or data.get("versions") == versions(), "made by other versions")
        check = EngineCheck.from_json(data.get("check"))
    except (CacheEntryError, OSError):
        return None
    return check if check.class_name == class_name and check.quantity == quantity else None


def keep_check(check: EngineCheck, key: str, directory: Path | None = None) -> Path | None:
    """Keep `check` in the user cache (or `directory`, a templates root: the package's when shipping)."""
    from ..template import cache_directory
    from .facts.store import facts_directory

    root = directory or cache_directory(installed_transformers_version() or "")
    path = facts_directory(class_directory(root, check.class_name)) / _name(check.quantity, key)
    return write_entry(path, {"format": FORMAT, "key": key, "versions": versions(), "check": check.to_json()})


def kept_or_made(quantity: str, module: Any, key: str, make: Any, directory: Path | None = None) -> EngineCheck:
    """The check kept for `key` in `directory` (a templates root; None: the package's, else the user cache's), or
    `make(module)`, kept there."""
    class_name = type(module).__name__
    if directory is None:
        found = find_check(quantity, class_name, key)
    else:
        found = read_check(quantity, directory, class_name, key, bound=False)
    if found is None:
        found = make(module)
        keep_check(found, key, directory)
    return found


@dataclass
class CheckFor:
    """One config's check of one quantity, for an answer: read from the package or the cache (`use_cache`), else
    made on the build (`make(module)`) and kept."""

    quantity: str
    key: str
    use_cache: bool
    make: Any
    found: EngineCheck | None = None

    def of(self, view: Any) -> EngineCheck:
        """The check for `view`'s class; FactsGap when none is kept and the view has no module to check."""
        from .model_view import FactsGap

        if self.kept(view) is None:
            if view.module is None:
                raise FactsGap(f"{QUANTITIES[self.quantity][0]} is checked against the trace once per config, on "
                               "the build")
            self.found = self.make(view.module)
            if self.use_cache:  # --no-cache neither answers from nor records
                keep_check(self.found, self.key)
        return self.found

    def kept(self, view: Any) -> EngineCheck | None:
        """The check if one is already known (no trace made here), else None."""
        if self.found is None and self.use_cache:
            self.found = find_check(self.quantity, view.class_name, self.key)
        return self.found


__all__ = ["CheckFor", "EngineCheck", "check_cut", "check_points", "find_check", "keep_check", "kept_or_made",
           "printable", "read_check", "run_check"]
