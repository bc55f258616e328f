"""Check before trusting: the analytic FLOP count held against FlopCounterMode on a short cut of the real class,
once per config, and the outcome kept beside the config's cost facts.

    the built module (meta) → a cut holding the first layer of each type (derived/derive.py's cut; the whole model
    where it has no single layer stack) → at two (B, S) points and one long sequence, the analytic count of the
    cut (analytic_flops on its view) against FlopCounterMode's (traced/flops.py): the forward, the training step
    and the checkpointed step → FlopCheck (equal, or the first term that differs) → kept at
    <templates>/<class>/costs/<key>.flops-check.json (the package's for the presets, else the user's cache)

A FLOP count is a polynomial in B and S (weights × B·S, attention × B·S², poolers × B, position projections × 1),
so two points with different B and S whose values no config integer shares tell every term apart, and a long
sequence catches a change of regime (an implementation that stops computing the full S² past some length). The
analytic engine answers from then on when they agree; when they do not, FlopCounterMode counts the whole model and
the report names the term that differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...disk_cache import CacheEntryError, class_directory, expect, installed_transformers_version, read_entry, \
    safe_name, versions, write_entry

FORMAT = 1
LONG_SEQ = 32_768  # the long point: the model's context, at most this (fake tensors: the length costs nothing)
MODES = ("forward", "training step", "checkpointed step")
STATUSES = ("equal", "differs", "unchecked")
MAX_WORDS = 2_000


@dataclass(frozen=True)
class FlopCheck:
    """The analytic count of a cut of `class_name` against FlopCounterMode's, at `points` (B, S)."""

    class_name: str
    status: str  # "equal" | "differs" | "unchecked" (the traced engine cannot run the class)
    layers: int  # the cut's repeated layers
    of_layers: int  # the model's (equal to layers: the whole model was traced)
    points: tuple[tuple[int, int], ...]
    modes: tuple[str, ...]  # of MODES, those checked (no checkpointed step for a class that cannot checkpoint)
    differs: str = ""  # where they first differ, or why the trace could not run, in words ("" when equal)

    @property
    def agree(self) -> bool:
        return self.status == "equal"

    def where(self) -> str:
        cut = "the whole model" if self.layers == self.of_layers else \
            f"a {self.layers}-of-{self.of_layers}-layer cut of {self.class_name}"
        points = ", ".join(f"B={b} S={s:,}" for b, s in self.points)
        return f"{cut} at {points} ({', '.join(self.modes)})"

    def words(self) -> str:
        if self.agree:
            return (f"checked once for this config: the analytic count equals FlopCounterMode's on fake tensors on "
                    f"{self.where()}; answered analytically")
        if self.status == "unchecked":
            return (f"unchecked: FlopCounterMode cannot count {self.class_name} here ({self.differs}), so the analytic "
                    "count is given without a check")
        return f"the analytic count differs from FlopCounterMode's on {self.where()}: {self.differs}"

    def to_json(self) -> dict[str, Any]:
        return {"class": self.class_name, "status": self.status, "layers": self.layers, "of_layers": self.of_layers,
                "points": [list(p) for p in self.points], "modes": list(self.modes), "differs": self.differs}

    @classmethod
    def from_json(cls, data: Any) -> "FlopCheck":
        """Every field checked: a cache entry is read, never trusted."""
        expect(isinstance(data, dict) and set(data) == {"class", "status", "layers", "of_layers", "points", "modes",
                                                        "differs"}, "not a FLOP check")
        expect(isinstance(data["class"], str) and data["status"] in STATUSES, "class or status malformed")
        for name in ("layers", "of_layers"):
            expect(type(data[name]) is int and 0 <= data[name] <= 1 << 16, f"{name} is not a layer count")
        expect(data["layers"] <= data["of_layers"], "the cut is longer than the model")
        points = data["points"]
        expect(isinstance(points, list) and 1 <= len(points) <= 8 and all(
            isinstance(p, list) and len(p) == 2 and all(type(v) is int and 1 <= v <= 1 << 24 for v in p)
            for p in points), "points are not (B, S) pairs")
        expect(isinstance(data["modes"], list) and data["modes"] and all(m in MODES for m in data["modes"]),
               "modes are not checked modes")
        differs = data["differs"]
        expect(isinstance(differs, str) and len(differs) <= MAX_WORDS and differs.isprintable()
               and bool(differs) == (data["status"] != "equal"), "differs is malformed")
        return cls(data["class"], data["status"], data["layers"], data["of_layers"],
                   tuple((b, s) for b, s in points), tuple(data["modes"]), differs)


# ------------------------------------------------------------------------------------------------- the check


def check_flops(module: Any) -> FlopCheck:
    """Hold the analytic count against FlopCounterMode's on a cut of `module` (built on meta)."""
    from ... import progress
    from ...errors import UnsupportedError
    from ..derived.derive import MAX_BATCH, config_integers, sample_points
    from ..dims import text_config
    from ..memory.serving import max_context

    cut, depth, count = _cut(module)
    limit = max_context(text_config(module.config)) or LONG_SEQ
    (b1, s1), (b2, s2) = sample_points((2, max(limit, 3)), config_integers(module.config), (2, MAX_BATCH))
    points = [(b1, s1), (b2, s2)]
    long = min(limit, LONG_SEQ)
    if long > max(s1, s2):
        points.append((1, long))
    checkpointing = bool(getattr(module, "supports_gradient_checkpointing", False))
    modes = MODES if checkpointing else MODES[:2]
    status = "differs"
    with progress.status(f"checking the analytic FLOP count against FlopCounterMode on {depth} layers of "
                         f"{type(module).__name__}"):
        try:
            differs = _first_difference(cut, points, checkpointing)
        except UnsupportedError as err:  # the traced step cannot feed the class (an audio or image model)
            status, differs = "unchecked", str(err)
        except Exception as err:  # broad on purpose: a class the fake-tensor trace cannot run is answered unchecked,
            # and says why, rather than not at all
            status, differs = "unchecked", f"the trace failed: {type(err).__name__}: {err}"
    if not differs:
        status = "equal"
    return FlopCheck(type(module).__name__, status, depth, count, tuple(points), modes, _printable(differs))


def _printable(words: str) -> str:
    return "".join(c if c.isprintable() else " " for c in words)[:MAX_WORDS]


# the config fields that count an encoder's or a decoder's layers, beside the decoder-only ones
STACK_KEYS = ("encoder_layers", "decoder_layers", "num_decoder_layers")


def _cut(module: Any) -> tuple[Any, int, int]:
    """(the cut, its repeated layers, the model's): each layer stack (an encoder-decoder has two) cut to the first
    layer of each of its types, two at least, so that what passes between layers shows; the whole model where no
    stack is found (ALBERT's shared groups)."""
    import torch

    from ..derived.derive import LAYER_COUNT_KEYS, cut_module, layer_types
    from ..dims import config_int, text_config

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
        if layers < count:
            cut = cut_module(cut, path, layers)
            if len(stacks) > 1:  # an encoder's or a decoder's own count (cut_module sets the decoder-only names)
                _set_stack_count(text_config(cut.config), path, count, layers)
        depth, total = depth + layers, total + count
    return cut, depth, total


def _set_stack_count(config: Any, path: str, count: int, layers: int) -> None:
    from ..dims import config_int

    decoder = "decoder" in path
    for key in STACK_KEYS:
        if ("decoder" in key) == decoder and config_int(config, key) == count:
            setattr(config, key, layers)


def _first_difference(cut: Any, points: list[tuple[int, int]], checkpointing: bool) -> str:
    """Where the analytic count of `cut` first differs from FlopCounterMode's, in words; "" when it never does."""
    from ...api import inspect_module
    from ..model_view import from_module
    from ..traced.flops import by_role, count_flops, module_roles
    from ..traced.step import StepSettings
    from .analytic import analytic_flops

    params = inspect_module(cut).params
    view = from_module(cut)
    roles = module_roles(params)
    for index, (batch, seq) in enumerate(points):
        at = f"at B={batch}, S={seq:,}"
        settings = StepSettings(batch=batch, seq=seq, precision="fp32")
        analytic = analytic_flops(view, params, batch=batch, seq=seq, training=True)
        if analytic is None:
            return f"{at}: the analytic engine gives no count"
        forward = count_flops(cut, settings, training=False)
        if forward.forward != analytic.forward:  # the terms that differ say where (the totals decide: a matmul
            # can be attributed to another role by each engine, DeBERTa's shared position projections)
            by_term = by_role(forward.forward_by_module, roles)
            terms = {t.role: t.flops for t in analytic.terms}
            differing = [f"{role} {terms.get(role, 0):,} analytic vs {by_term.get(role, 0):,} traced"
                         for role in sorted(set(terms) | set(by_term)) if terms.get(role, 0) != by_term.get(role, 0)]
            return (f"{at}, the forward {analytic.forward:,} analytic vs {forward.forward:,} traced"
                    + (": " + "; ".join(differing) if differing else ""))
        step = count_flops(cut, settings, training=True)
        for name, a, t in (("the step's forward", analytic.forward, step.forward),
                           ("the backward", analytic.backward, step.model_backward),
                           ("the recomputation", analytic.recompute, step.recompute)):
            if a != t:
                return f"{at}, {name} {a:,} analytic vs {t:,} traced"
        if checkpointing and index < 2:  # the reruns are per layer, as the weights are: two points tell them
            checked = analytic_flops(view, params, batch=batch, seq=seq, training=True, checkpointing=True)
            rerun = count_flops(cut, dataclasses.replace(settings, grad_checkpointing=True), training=True)
            if checked.recompute != rerun.recompute:
                return (f"{at}, the checkpointed step's recomputation {checked.recompute:,} analytic vs "
                        f"{rerun.recompute:,} traced")
    return ""


# ------------------------------------------------------------------------------------------------- the store


def _name(key: str) -> str:
    return f"{safe_name(key)}.flops-check.json"


def find_check(class_name: str, key: str) -> FlopCheck | None:
    """The check kept for `key`: the package's (the presets'), else the user cache's; None when neither holds one
    for this class and these versions."""
    from ...template import cache_directory, shipped_directory
    from ..facts.store import facts_directory

    version = installed_transformers_version()
    if version is None:
        return None
    for root, bound in ((shipped_directory(version), False), (cache_directory(version), True)):
        found = _read(facts_directory(class_directory(root, class_name)) / _name(key), key, class_name, bound)
        if found is not None:
            return found
    return None


def _read(path: Path, key: str, class_name: str, bound: bool) -> FlopCheck | None:
    try:
        data = read_entry(path)
        expect(isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key,
               "not a FLOP check for this key")
        # the user cache's entries are bound to the versions that made them; the package's are the package's
        expect(not bound or data.get("versions") == versions(), "made by other versions")
        check = FlopCheck.from_json(data.get("check"))
    except (CacheEntryError, OSError):
        return None
    return check if check.class_name == class_name else None


def keep_check(check: FlopCheck, key: str, directory: Path | None = None) -> Path | None:
    """Keep `check` in the user cache (or `directory`, a templates root: the package's when shipping)."""
    from ...template import cache_directory
    from ..facts.store import facts_directory

    root = directory or cache_directory(installed_transformers_version() or "")
    path = facts_directory(class_directory(root, check.class_name)) / _name(key)
    return write_entry(path, {"format": FORMAT, "key": key, "versions": versions(), "check": check.to_json()})


def record_check(module: Any, key: str, directory: Path | None = None) -> FlopCheck:
    """The check kept for `key` in `directory` (a templates root; None: the package's, else the user cache's), or
    one made on `module` and kept there: recorded with a config's cost facts (facts/record.py)."""
    from ..facts.store import facts_directory

    class_name = type(module).__name__
    if directory is None:
        found = find_check(class_name, key)
    else:
        found = _read(facts_directory(class_directory(directory, class_name)) / _name(key), key, class_name, False)
    if found is None:
        found = check_flops(module)
        keep_check(found, key, directory)
    return found


__all__ = ["FlopCheck", "check_flops", "find_check", "keep_check", "record_check"]
