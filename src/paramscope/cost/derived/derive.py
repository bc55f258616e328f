"""Derive a class's training-step memory as closed forms in B and S, from a few traces of short cuts of it.

    the model (meta) → its repeated layers and each one's type (structure and settings) → the shortest cut that
    holds the first layer, every middle type twice and the last layer's type → two traces of the cut at
    (B₁, S₁), (B₂, S₂) (traced/timeline.py) → each allocation's size as a polynomial (symbols.py) and the step
    laid out by segment (recipe.py) → checked against a trace of a longer cut at the asked B and S → DerivedRecipe

Regimes are kept apart, never averaged: the sequence lengths a sliding window or an attention chunk splits (S up to
the window, S beyond it) each get their own recipe, derived from traces inside that range.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ... import progress
from ..dims import config_int, text_config
from .recipe import DerivedPeaks, DerivedRecipe, Entry
from .symbols import NotDerivable, size

LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# config fields at which the step's shapes change regime as S crosses them
REGIME_KEYS = ("sliding_window", "attention_chunk_size")
MAX_SEQ = 1 << 24
MAX_BATCH = 1 << 20


def layer_stack(module: Any) -> tuple[str, int]:
    """(path, count) of the model's repeated layers: the ModuleList as long as the config's layer count."""
    import torch

    text = text_config(getattr(module, "config", None))
    count = config_int(text, *LAYER_COUNT_KEYS) if text is not None else None
    if count is None:
        raise NotDerivable("the config names no layer count")
    found = [name for name, sub in module.named_modules()
             if isinstance(sub, torch.nn.ModuleList) and len(sub) == count and name]
    if len(found) != 1:
        raise NotDerivable(f"{'no' if not found else len(found)} module lists of {count} layers")
    return found[0], count


def layer_types(layers: Any) -> tuple[str, ...]:
    """Each layer's type: its modules' classes, parameters' shapes and dtypes, and plain settings (a sliding
    window, a flag), less the settings that only number the layers (layer_idx: i, or i + a constant)."""
    described = []
    for layer in layers:
        settings: dict[tuple[str, str], Any] = {}
        structure = []
        for name, sub in layer.named_modules():
            for key, value in vars(sub).items():
                if not key.startswith("_") and key != "training" and \
                        isinstance(value, (int, float, str, bool, type(None))):
                    settings[(name, key)] = value
            params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in sub.named_parameters(recurse=False))
            structure.append((name, type(sub).__name__, params))
        described.append((settings, structure))
    numbering = set()
    if len(described) > 1:
        for key in described[0][0]:
            values = [settings.get(key) for settings, _ in described]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values) and \
                    all(v - i == values[0] for i, v in enumerate(values)):
                numbering.add(key)
    signatures = [repr((sorted((k, v) for k, v in settings.items() if k not in numbering), structure))
                  for settings, structure in described]
    names: dict[str, str] = {}
    return tuple(names.setdefault(s, f"type {len(names) + 1}") for s in signatures)


def contexts(types: tuple[str, ...]) -> tuple[str, ...]:
    """Each middle layer's context: its type between its neighbours' (what a layer frees of its neighbour's, the
    neighbour's type decides)."""
    return tuple("|".join(types[i - 1:i + 2]) for i in range(1, len(types) - 1))


def choose_depths(types: tuple[str, ...]) -> tuple[int, int]:
    """(D, D'): the shortest cut whose layers are the model's first D − 1 and one of the last layer's type, with
    every middle context (a type between its neighbours') at least twice among its middle layers (once, where twice
    needs over 24 layers); and the next such cut, longer, for the check."""
    count = len(types)
    wanted = set(contexts(types))

    def good(depth: int, times: int) -> bool:
        cut = contexts(types[:depth - 1] + types[-1:])
        return types[depth - 1] == types[-1] and all(cut.count(c) >= times for c in wanted)

    for times, longest in ((2, 24), (1, 64)):
        depths = [d for d in range(3, min(count, longest) + 1) if good(d, times)]
        if len(depths) >= 2:
            return depths[0], depths[1]
    raise NotDerivable(f"no short cut of the {count} layers ({len(set(types))} types) repeats them")


def cut_module(module: Any, depth: int, dtype: str | None) -> Any:
    """The same class built on meta from the config cut to `depth` layers (lists as long as the layers cut too)."""
    from ...build import build_class_on_meta

    config = copy.deepcopy(module.config)
    text = text_config(config)
    count = config_int(text, *LAYER_COUNT_KEYS)
    for key in LAYER_COUNT_KEYS:
        if config_int(text, key) == count:
            setattr(text, key, depth)
    for key, value in list(vars(text).items()):
        if isinstance(value, (list, tuple)) and len(value) == count and not key.startswith("_"):
            setattr(text, key, type(value)(value[:depth]))
    return build_class_on_meta(type(module), config, dtype=dtype)


def regime_of(config: Any, seq: int, limit: int | None) -> tuple[tuple[int, int], str]:
    """The range of S around `seq` in which no config threshold is crossed, and its name."""
    text = text_config(config)
    thresholds = sorted({v for key in REGIME_KEYS if (v := config_int(text, key))})
    low, high, words = 1, limit or MAX_SEQ, []
    for key in REGIME_KEYS:
        value = config_int(text, key)
        if not value:
            continue
        if seq <= value:
            high = min(high, value)
            words.append(f"S ≤ {key} {value:,}")
        else:
            low = max(low, value + 1)
            words.append(f"S > {key} {value:,}")
    del thresholds
    return (low, max(low, high)), "; ".join(words) or "one regime for every S"


def sample_points(seq_range: tuple[int, int], avoid: set[int], batch_range: tuple[int, int]
                  ) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two (B, S) inside the ranges whose values no config integer shares, so that no two forms of a dimension
    agree on both."""
    low, high = seq_range
    picked: list[int] = []
    s = max(low, 17)
    while len(picked) < 2 and s <= high:
        if _prime(s) and not {s - 2, s - 1, s, s + 1, s + 2} & avoid:
            picked.append(s)
        s += 1
    if len(picked) < 2:  # a narrow range: any two lengths in it (or the one)
        picked = [low, min(high, low + 1)]
    batches = (1, 1) if batch_range == (1, 1) else (3, 2)
    return (batches[0], picked[0]), (batches[1], picked[1])


def _prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n ** 0.5) + 1))


def _config_integers(config: Any) -> set[int]:
    found: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if depth > 4:
            return
        if isinstance(value, bool):
            return
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            for item in value[:64]:
                walk(item, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, depth + 1)
        elif hasattr(value, "to_dict"):
            walk(value.to_dict(), depth + 1)

    walk(config, 0)
    return found


def derive_training(module: Any, settings: Any, *, seq: int, batch: int = 1,
                    max_context: int | None = None) -> DerivedRecipe:
    """The recipe for `module`'s training step under `settings` (traced/step.StepSettings; its batch and seq are
    replaced), in the regime that holds `seq`, checked against a trace at `batch` × `seq` before it is returned."""
    from ..traced.timeline import record_training_step

    if settings.grad_checkpointing:
        raise NotDerivable("gradient checkpointing is traced in full")
    path, count = layer_stack(module)
    types = layer_types(module.get_submodule(path))
    if count < 4:
        raise NotDerivable(f"{count} layers: the whole model is traced")
    depth, check_depth = choose_depths(types)
    dtype = _build_dtype(module)
    seq_range, regime = regime_of(module.config, seq, max_context)
    # batch 1 is a regime of its own: torch and transformers take views (and skip an expansion) that a batch of
    # several cannot
    batch_range = (1, 1) if batch == 1 else (2, MAX_BATCH)
    regime = f"B = 1; {regime}" if batch == 1 else f"B ≥ 2; {regime}"
    at1, at2 = sample_points(seq_range, _config_integers(module.config), batch_range)
    with progress.status(f"deriving {type(module).__name__}'s training memory from traces of {depth} and "
                         f"{check_depth} layers"):
        cut = cut_module(module, depth, dtype)
        cut_path, _ = layer_stack(cut)
        expected = types[:depth - 1] + types[-1:]
        if layer_types(cut.get_submodule(cut_path)) != _renamed(types, expected):
            raise NotDerivable(f"a cut of {depth} layers does not keep the layers' types")
        first = record_training_step(cut, dataclasses.replace(settings, batch=at1[0], seq=at1[1]), cut_path)
        second = record_training_step(cut, dataclasses.replace(settings, batch=at2[0], seq=at2[1]), cut_path)
        recipe = build_recipe(first, second, at1, at2, cut_types=expected, model_types=types, seq_range=seq_range,
                              batch_range=batch_range, regime=regime)
        check_cut = cut_module(module, check_depth, dtype)
        check_at = (batch, seq) if recipe.covers(batch, seq) else (batch_range[0], seq_range[0])
        check = record_training_step(check_cut, dataclasses.replace(settings, batch=check_at[0], seq=check_at[1]),
                                     cut_path)
    check_types = types[:check_depth - 1] + types[-1:]
    predicted = recipe.peaks(*check_at, layer_types=check_types)
    measured = DerivedPeaks(*check.peaks(), predicted.gradients_at_backward_peak)
    if predicted != measured:
        raise NotDerivable(f"the recipe from {depth} layers gives {predicted.forward:,} / {predicted.backward:,} B "
                           f"for {check_depth} layers at B={check_at[0]}, S={check_at[1]}, the trace "
                           f"{measured.forward:,} / {measured.backward:,} B")
    return dataclasses.replace(
        recipe,
        traced=(f"traced at {depth} layers, B={at1[0]}, S={at1[1]} and B={at2[0]}, S={at2[1]} (fake tensors, "
                "every allocation and free)"),
        check=(f"checked against a trace of {check_depth} layers at B={check_at[0]}, S={check_at[1]}: forward peak "
               f"{measured.forward:,} B, backward peak {measured.backward:,} B, equal to the byte"))


def _renamed(types: tuple[str, ...], expected: tuple[str, ...]) -> tuple[str, ...]:
    """`expected` with its types renumbered in order of appearance, as layer_types numbers a cut's."""
    names: dict[str, str] = {}
    return tuple(names.setdefault(t, f"type {len(names) + 1}") for t in expected)


def _build_dtype(module: Any) -> str | None:
    for param in module.parameters():
        if param.dtype.is_floating_point:
            return str(param.dtype).removeprefix("torch.")
    return None


def build_recipe(first: Any, second: Any, at1: tuple[int, int], at2: tuple[int, int], *, cut_types: tuple[str, ...],
                 model_types: tuple[str, ...], seq_range: tuple[int, int], batch_range: tuple[int, int],
                 regime: str) -> DerivedRecipe:
    """Lay the two aligned timelines of one cut out as a recipe (see recipe.py)."""
    from ..traced.timeline import ALLOC, MARK

    if [(k, w) for k, w in first.events] != [(k, w) for k, w in second.events] or \
            len(first.allocations) != len(second.allocations):
        raise NotDerivable("the step allocates differently at the two sample points")
    sizes = tuple(size(a.shape, b.shape, a.nbytes, b.nbytes, a.itemsize, at1, at2)
                  for a, b in zip(first.allocations, second.allocations))
    gradient = tuple(a.gradient for a in first.allocations)
    depth = first.layers
    # each event's segment: "prefix", ("fw", i), "head", ("bw", i)
    segments: dict[Any, list[tuple[str, int]]] = {}
    owner: dict[int, tuple[Any, int]] = {}  # allocation → (segment, position among the segment's events)
    current: Any = "prefix"
    expected_markers = [("fw", i) for i in range(depth)] + [("end-fw",)] + \
        [("bw", i) for i in reversed(range(depth))] + [("end-bw",)]
    markers = [w for k, w in first.events if k == MARK]
    if markers != expected_markers:
        raise NotDerivable("the layers do not run once each, in order, forward then backward")
    for kind, what in first.events:
        if kind == MARK:
            current = "head" if what == ("end-fw",) else "end" if what == ("end-bw",) else what
            continue
        events = segments.setdefault(current, [])
        if kind == ALLOC:
            owner[what] = (current, len(events))
        events.append((kind, what))
    if segments.get("end"):
        raise NotDerivable("allocations after the backward returned")
    middle = range(1, depth - 1)
    type_of = dict(zip(middle, contexts(cut_types)))

    def is_middle(segment: Any) -> bool:
        return isinstance(segment, tuple) and segment[1] in middle

    def plain(key: Any) -> tuple[Entry, ...]:
        return tuple((1 if kind == ALLOC else -1, what, None) for kind, what in segments.get(key, []))

    def boundary(key: Any) -> tuple[Entry, ...]:
        entries: list[Entry] = []
        groups: dict[tuple, list[int]] = {}  # (direction, type, position) → the middle layers freed from
        for kind, what in segments.get(key, []):
            if kind == ALLOC or not is_middle(owner.get(what, ("prefix", 0))[0]):
                entries.append((1 if kind == ALLOC else -1, what, None))
                continue
            (direction, layer), position = owner[what]
            group = (direction, type_of[layer], position)
            if group not in groups:
                groups[group] = []
                entries.append((-1, what, type_of[layer]))  # placeholder; settled below
            groups[group].append(layer)
        settled: list[Entry] = []
        seen: set[tuple] = set()
        for sign, what, kind in entries:
            if kind is None:
                settled.append((sign, what, None))
                continue
            (direction, layer), position = owner[what]
            group = (direction, kind, position)
            if group in seen:
                continue
            seen.add(group)
            layers = sorted(groups[group])
            of_type = [i for i in middle if type_of[i] == kind]
            if layers == of_type and len(of_type) > 1:
                settled.append((-1, what, kind))  # freed for every middle layer of the type
            elif len(layers) == 1 and layers[0] in (1, depth - 2):
                settled.append((-1, what, None))  # freed once, from the layer beside the boundary
            else:
                raise NotDerivable(f"a segment at the boundary frees allocations of layers {layers}")
        return tuple(settled)

    def representative(direction: str) -> dict[str, tuple[Entry, ...]]:
        chosen: dict[str, tuple[Entry, ...]] = {}
        for layer in middle:
            entries = plain((direction, layer))
            signed = [(sign, sizes[what]) for sign, what, _ in entries]
            kind = type_of[layer]
            if kind in chosen:
                if [(sign, sizes[what]) for sign, what, _ in chosen[kind]] != signed:
                    raise NotDerivable(f"two middle layers of one type allocate differently ({direction})")
            else:
                chosen[kind] = entries
        return chosen

    return DerivedRecipe(
        sizes=sizes, gradient=gradient, prefix=boundary("prefix"), first_forward=boundary(("fw", 0)),
        middle_forward=representative("fw"), last_forward=boundary(("fw", depth - 1)), head_backward=boundary("head"),
        last_backward=boundary(("bw", depth - 1)), middle_backward=representative("bw"),
        first_backward=boundary(("bw", 0)), layer_types=model_types, seq_range=seq_range, batch_range=batch_range,
        regime=regime, traced="",
        check="")


class DerivedStep:
    """One model's recipes under one set of settings, a recipe per regime, each derived when a question first
    reaches its regime (a largest batch or context searched across them)."""

    def __init__(self, module: Any, settings: Any, limit: int | None, recipes: list[DerivedRecipe]) -> None:
        self.module, self.settings, self.limit = module, settings, limit
        self.recipes = recipes
        self.declined: list[str] = []

    @property
    def recipe(self) -> DerivedRecipe:
        """The asked batch and length's recipe (the first derived)."""
        return self.recipes[0]

    def at(self, batch: int, seq: int) -> DerivedPeaks | None:
        """The figures at `batch` × `seq`; None where that regime's derivation declines."""
        for recipe in self.recipes:
            if recipe.covers(batch, seq):
                return recipe.peaks(batch, seq)
        try:
            recipe = derive_training(self.module, self.settings, seq=seq, batch=batch, max_context=self.limit)
        except NotDerivable as err:
            self.declined.append(f"B={batch}, S={seq}: {err}")
            self.recipes.append(_declined(batch, seq, self.module.config, self.limit))
            return None
        self.recipes.append(recipe)
        return recipe.peaks(batch, seq)

    def notes(self) -> list[str]:
        recipe = self.recipe
        return [f"derived: {recipe.traced}; {recipe.check}",
                f"derived regime: {recipe.regime}; another batch or length in it is answered from the closed form, "
                "another regime is derived when first asked"]


def _declined(batch: int, seq: int, config: Any, limit: int | None) -> DerivedRecipe:
    """A stand-in that covers a regime whose derivation declined, so it is not tried again."""
    seq_range, regime = regime_of(config, seq, limit)
    empty: tuple[Entry, ...] = ()
    return _Declined(sizes=(), gradient=(), prefix=empty, first_forward=empty, middle_forward={}, last_forward=empty,
                     head_backward=empty, last_backward=empty, middle_backward={}, first_backward=empty,
                     layer_types=(), seq_range=seq_range, batch_range=(1, 1) if batch == 1 else (2, MAX_BATCH),
                     regime=regime, traced="declined", check="")


class _Declined(DerivedRecipe):
    def peaks(self, *args: Any, **kwargs: Any) -> Any:
        return None
