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
from .recipe import DerivedPeaks, DerivedRecipe, Entry, contexts, multipliers
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


def choose_depths(types: tuple[str, ...]) -> tuple[int, int, int | None]:
    """(D, D', D''): the shortest cut whose layers are the model's first D − 1 and one of the last layer's type, with
    every middle context (recipe.contexts) at least twice among its middle layers (its type's first layer once; all
    once where twice needs over 24 layers); the next such cut, longer, for the check; and the next (None if none),
    for the check of what grew from D to D' outside the layers."""
    count = len(types)
    wanted = set(contexts(types))

    def good(depth: int, times: int) -> bool:
        cut = contexts(types[:depth - 1] + types[-1:])
        return types[depth - 1] == types[-1] and \
            all(cut.count(c) >= (1 if c.endswith("|first") else times) for c in wanted)

    for times, longest in ((2, 24), (1, 64)):
        depths = [d for d in range(3, min(count, longest) + 1) if good(d, times)]
        if len(depths) >= 2:
            return depths[0], depths[1], depths[2] if len(depths) > 2 else None
    raise NotDerivable(f"no short cut of the {count} layers ({len(set(types))} types) repeats them")


def cut_module(module: Any, path: str, depth: int) -> Any:
    """A copy of `module` (on meta, or fake: no storage is copied) with only its first `depth` repeated layers, its
    config's layer count and the lists as long as the layers cut to match. Works on any wrapping of the layers (a
    PEFT model, QLoRA's stand-ins): the copy is the same objects, less the layers beyond the cut."""
    import torch

    layers = module.get_submodule(path)
    parent_path, _, name = path.rpartition(".")
    parent = module.get_submodule(parent_path) if parent_path else module
    count = len(layers)
    setattr(parent, name, torch.nn.ModuleList(list(layers)[:depth]))
    try:
        cut = copy.deepcopy(module)
    finally:
        setattr(parent, name, layers)
    text = text_config(getattr(cut, "config", None))
    if text is not None:
        for key in LAYER_COUNT_KEYS:
            if config_int(text, key) == count:
                setattr(text, key, depth)
        for key, value in list(vars(text).items()):
            if isinstance(value, (list, tuple)) and len(value) == count and not key.startswith("_"):
                setattr(text, key, type(value)(value[:depth]))
    return cut


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

    path, count = layer_stack(module)
    types = layer_types(module.get_submodule(path))
    if count < 4:
        raise NotDerivable(f"{count} layers: the whole model is traced")
    depth, check_depth, third_depth = choose_depths(types)
    seq_range, regime = regime_of(module.config, seq, max_context)
    # batch 1 is a regime of its own: torch and transformers take views (and skip an expansion) that a batch of
    # several cannot
    batch_range = (1, 1) if batch == 1 else (2, MAX_BATCH)
    regime = f"B = 1; {regime}" if batch == 1 else f"B ≥ 2; {regime}"
    at1, at2 = sample_points(seq_range, _config_integers(module.config), batch_range)

    def trace(layers: int, at: tuple[int, int]) -> Any:
        cut = cut_module(module, path, layers)
        return record_training_step(cut, dataclasses.replace(settings, batch=at[0], seq=at[1]), path)

    with progress.status(f"deriving {type(module).__name__}'s training memory from traces of {depth} and "
                         f"{check_depth} layers"):
        first, second = trace(depth, at1), trace(depth, at2)
        recipe = build_recipe(first, second, at1, at2, cut_types=types[:depth - 1] + types[-1:], model_types=types,
                              seq_range=seq_range, batch_range=batch_range, regime=regime)
        check_at = (batch, seq) if recipe.covers(batch, seq) else (batch_range[0], seq_range[0])
        check = trace(check_depth, check_at)
        grown = grow_boundaries(recipe, check, types[:check_depth - 1] + types[-1:], check_at)
        checks = [(check_depth, check_at, check)]
        if grown is not recipe:  # what grew was read from the check: a longer cut checks it
            if third_depth is None:
                raise NotDerivable("allocations outside the layers grow with the depth, and no longer cut checks them")
            recipe = grown
            third_at = (batch_range[0], seq_range[0]) if check_at != (batch_range[0], seq_range[0]) else at1
            checks.append((third_depth, third_at, trace(third_depth, third_at)))
    for layers, at, timeline in checks:
        predicted = recipe.peaks(*at, layer_types=types[:layers - 1] + types[-1:])
        measured = DerivedPeaks(*timeline.peaks(), predicted.gradients_at_backward_peak)
        if predicted != measured:
            raise NotDerivable(f"the recipe from {depth} layers gives {predicted.forward:,} / {predicted.backward:,} "
                               f"B for {layers} layers at B={at[0]}, S={at[1]}, the trace {measured.forward:,} / "
                               f"{measured.backward:,} B")
    words = "; ".join(f"{layers} layers at B={at[0]}, S={at[1]}: forward peak {t.peaks()[0]:,} B, backward peak "
                      f"{t.peaks()[2]:,} B" for layers, at, t in checks)
    grew = " (what the step builds per layer outside the layers, such as a cache layer's tensors, read from the " \
        "first check)" if len(checks) > 1 else ""
    return dataclasses.replace(
        recipe,
        traced=(f"traced at {depth} layers, B={at1[0]}, S={at1[1]} and B={at2[0]}, S={at2[1]} (fake tensors, "
                f"every allocation and free){grew}"),
        check=f"checked against a trace of {words}, equal to the byte")


def grow_boundaries(recipe: DerivedRecipe, check: Any, check_types: tuple[str, ...],
                    at: tuple[int, int]) -> DerivedRecipe:
    """The recipe with the allocations (and frees) outside the layers that a longer cut makes once per added layer,
    such as the 8 B a training step's DynamicCache builds per sliding layer; the recipe itself when none grew."""
    from ..traced.timeline import ALLOC, MARK
    from .symbols import evaluate

    counts = multipliers(check_types, recipe.cut_types)
    values = [evaluate(poly, *at) for poly in recipe.sizes]
    depth = check.layers
    actual: dict[Any, list[tuple[int, int]]] = {}
    current: Any = "prefix"
    for kind, what in check.events:
        if kind == MARK:
            current = "head" if what == ("end-fw",) else what
            continue
        actual.setdefault(current, []).append((1 if kind == ALLOC else -1, check.allocations[what].nbytes))
    segments = {"prefix": "prefix", "first_forward": ("fw", 0), "last_forward": ("fw", depth - 1),
                "head_backward": "head", "last_backward": ("bw", depth - 1), "first_backward": ("bw", 0)}
    added = [t for t in set(check_types) for _ in range(list(check_types).count(t) - list(recipe.cut_types).count(t))]
    changes: dict[str, tuple[Entry, ...]] = {}
    for name, key in segments.items():
        entries = getattr(recipe, name)
        grown = _grown_segment(entries, actual.get(key, []), values, counts, added, name)
        if grown is not None:
            changes[name] = grown
    return dataclasses.replace(recipe, **changes) if changes else recipe


def _grown_segment(entries: tuple[Entry, ...], have: list[tuple[int, int]], values: list[int],
                   counts: dict[str, int], added: list[str], name: str) -> tuple[Entry, ...] | None:
    """One boundary segment grown by what the check's cut makes there per added layer; None when it matches.

    Compared run by run (allocations in order; a run of frees as a multiset, its order being the collector's)."""
    import difflib
    from collections import Counter

    def runs(signs: list[int]) -> list[tuple[int, int, int]]:  # (sign, start, end)
        found: list[tuple[int, int, int]] = []
        for i, sign in enumerate(signs):
            if found and found[-1][0] == sign:
                found[-1] = (sign, found[-1][1], i + 1)
            else:
                found.append((sign, i, i + 1))
        return found

    def times_of(entry: Entry) -> int:
        return 1 if entry[2] is None else counts.get(entry[2], 0)

    mine, theirs = runs([e[0] for e in entries]), runs([sign for sign, _ in have])
    expanded = [[values[e[1]]] * times_of(e) for e in entries]
    same = len(mine) == len(theirs) and all(
        Counter(v for e in range(a0, a1) for v in expanded[e]) == Counter(v for _, v in have[b0:b1])
        for (_, a0, a1), (_, b0, b1) in zip(mine, theirs))
    if same and all([v for e in range(a0, a1) for v in expanded[e]] == [v for _, v in have[b0:b1]]
                    for (sign, a0, a1), (_, b0, b1) in zip(mine, theirs) if sign > 0):
        return None
    if len(set(added)) != 1 or len(mine) != len(theirs) or any(m[0] != t[0] for m, t in zip(mine, theirs)):
        raise NotDerivable(f"allocations outside the layers ({name}) change with the depth in a way the added "
                           "layers do not repeat")
    kind, times = added[0], len(added)

    def closed_form(value: int) -> int:
        index = next((e[1] for e in entries if values[e[1]] == value), None)
        if index is None:
            index = next((i for i, v in enumerate(values) if v == value), None)
        if index is None:
            raise NotDerivable(f"an allocation of {value:,} B outside the layers grows with the depth and has no "
                               "closed form")
        return index

    grown: list[Entry] = []
    for (sign, a0, a1), (_, b0, b1) in zip(mine, theirs):
        run = list(entries[a0:a1])
        wanted = [v for _, v in have[b0:b1]]
        if sign < 0:
            extra = Counter(wanted) - Counter(v for e in range(a0, a1) for v in expanded[e])
            if Counter(v for e in range(a0, a1) for v in expanded[e]) - Counter(wanted) or \
                    any(n % times for n in extra.values()):
                raise NotDerivable(f"frees outside the layers ({name}) change with the depth in a way the added "
                                   "layers do not repeat")
            run += [(-1, closed_form(v), "+" + kind) for v, n in sorted(extra.items()) for _ in range(n // times)]
        else:
            flat = [v for e in range(a0, a1) for v in expanded[e]]
            starts = [sum(len(expanded[e]) for e in range(a0, k)) for k in range(a0, a1 + 1)]
            shift = 0
            for op, f0, _, t0, t1 in difflib.SequenceMatcher(a=flat, b=wanted, autojunk=False).get_opcodes():
                if op == "equal":
                    continue
                block = wanted[t0:t1]
                if op != "insert" or f0 not in starts or len(block) % times or \
                        block != block[:len(block) // times] * times:
                    raise NotDerivable(f"allocations outside the layers ({name}) change with the depth in a way "
                                       "the added layers do not repeat")
                new = [(1, closed_form(v), "+" + kind) for v in block[:len(block) // times]]
                at = starts.index(f0) + shift
                run[at:at] = new
                shift += len(new)
        grown += run
    return tuple(grown)


def _renamed(types: tuple[str, ...], expected: tuple[str, ...]) -> tuple[str, ...]:
    """`expected` with its types renumbered in order of appearance, as layer_types numbers a cut's."""
    names: dict[str, str] = {}
    return tuple(names.setdefault(t, f"type {len(names) + 1}") for t in expected)


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
            if layers == of_type and (len(of_type) > 1 or layers[0] not in (1, depth - 2)) and \
                    not kind.endswith("|first"):
                settled.append((-1, what, kind))  # freed for every middle layer of the context (the check holds a
                # context seen once to it)
            elif len(layers) == 1 and (layers[0] in (1, depth - 2) or kind.endswith("|first")):
                settled.append((-1, what, None))  # freed once: from the layer beside the boundary, or what its
                # type's first layer alone made
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
        first_backward=boundary(("bw", 0)), layer_types=model_types, cut_types=cut_types, seq_range=seq_range, batch_range=batch_range,
        regime=regime, traced="",
        check="")


class DerivedStep:
    """One model's recipes under one set of settings, a recipe per regime: read from the cache, or derived when a
    question first reaches its regime (a largest batch or context searched across them) and kept."""

    def __init__(self, module: Any, class_name: str, config: Any, settings: Any, limit: int | None,
                 live: bool = False) -> None:
        self.module, self.class_name, self.config = module, class_name, config
        self.settings, self.limit = settings, limit
        # a live module (a PEFT plan, a user's half-frozen model) is more than its config: its structure is keyed
        self.structure = structure_of(module) if live and module is not None else None
        self.recipes: list[DerivedRecipe] = []
        self.declined: list[str] = []
        self.from_cache = 0

    @classmethod
    def first(cls, module: Any, class_name: str, config: Any, settings: Any, *, batch: int, seq: int,
              limit: int | None, live: bool = False) -> "DerivedStep | None":
        """The step with the asked point's recipe; None when it is not cached and there is no module to trace
        (NotDerivable when the derivation declines)."""
        step = cls(module, class_name, config, settings, limit, live)
        recipe = step._recipe(batch, seq)
        if recipe is None:
            return None
        step.recipes.append(recipe)
        return step

    def _recipe(self, batch: int, seq: int) -> DerivedRecipe | None:
        from .store import find_recipe, keep_recipe, recipe_key

        seq_range, _ = regime_of(self.config, seq, self.limit)
        key = recipe_key(self.class_name, self.config, self.settings, batch, seq_range, self.structure)
        recipe = find_recipe(self.class_name, key)
        if recipe is not None:
            self.from_cache += 1
            return recipe
        if self.module is None:
            return None
        recipe = derive_training(self.module, self.settings, seq=seq, batch=batch, max_context=self.limit)
        keep_recipe(self.class_name, key, recipe)
        return recipe

    @property
    def recipe(self) -> DerivedRecipe:
        """The asked batch and length's recipe (the first)."""
        return self.recipes[0]

    def at(self, batch: int, seq: int) -> DerivedPeaks | None:
        """The figures at `batch` × `seq`; None where that regime's derivation declines (or needs a build)."""
        for recipe in self.recipes:
            if recipe.covers(batch, seq):
                return recipe.peaks(batch, seq)
        try:
            recipe = self._recipe(batch, seq)
        except NotDerivable as err:
            recipe, why = None, str(err)
        else:
            why = "not cached; it needs the build" if recipe is None else ""
        if recipe is None:
            self.declined.append(f"B={batch}, S={seq}: {why}")
            self.recipes.append(_declined(batch, seq, self.config, self.limit))
            return None
        self.recipes.append(recipe)
        return recipe.peaks(batch, seq)

    def notes(self) -> list[str]:
        recipe = self.recipe
        cached = " (read from the cache: derived and checked by an earlier run)" if self.from_cache else ""
        return [f"derived{cached}: {recipe.traced}; {recipe.check}",
                f"derived regime: {recipe.regime}; another batch or length in it is answered from the closed form, "
                "another regime is derived when first asked"]


def structure_of(module: Any) -> str:
    """A digest of a module's structure: every parameter's name, shape, dtype and whether it trains, and every
    module's class (a PEFT plan's rank, targets and frozen base, QLoRA's stand-ins)."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}:{param.requires_grad};".encode())
    for name, sub in module.named_modules():
        digest.update(f"{name}:{type(sub).__module__}.{type(sub).__name__};".encode())
    return digest.hexdigest()[:32]


def _declined(batch: int, seq: int, config: Any, limit: int | None) -> DerivedRecipe:
    """A stand-in that covers a regime whose derivation declined, so it is not tried again."""
    seq_range, regime = regime_of(config, seq, limit)
    empty: tuple[Entry, ...] = ()
    return _Declined(sizes=(), gradient=(), prefix=empty, first_forward=empty, middle_forward={}, last_forward=empty,
                     head_backward=empty, last_backward=empty, middle_backward={}, first_backward=empty,
                     layer_types=(), cut_types=(), seq_range=seq_range, batch_range=(1, 1) if batch == 1 else (2, MAX_BATCH),
                     regime=regime, traced="declined", check="")


class _Declined(DerivedRecipe):
    def peaks(self, *args: Any, **kwargs: Any) -> Any:
        return None
