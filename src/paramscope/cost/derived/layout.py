"""A recipe laid out from recorded timelines: segments by layer, middle layers by context, boundary frees that count
once per middle layer, and what a longer cut adds outside the layers (derive.py calls these; recipe.py evaluates).

    two aligned timelines of one cut (traced/timeline.py) → each allocation's size (symbols.py) → the events of each
    segment: prefix, each layer's forward and backward, the loss and head's backward → DerivedRecipe
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .recipe import DerivedRecipe, Entry, contexts, multipliers
from .symbols import NotDerivable, size


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


def grow_boundaries(recipe: DerivedRecipe, check: Any, check_types: tuple[str, ...],
                    at: tuple[int, int]) -> list[DerivedRecipe]:
    """The recipe with the allocations (and frees) outside the layers that a longer cut makes once per added layer,
    such as the 8 B a training step's DynamicCache builds per sliding layer: one candidate per layer type they may
    belong to (where the added layers are of several types, a third cut tells them apart); [the recipe] when none
    grew."""
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
    added = [t for t in sorted(set(check_types))
             for _ in range(list(check_types).count(t) - list(recipe.cut_types).count(t))]
    candidates: list[DerivedRecipe] = []
    why = None
    for kind in sorted(set(added)):
        changes: dict[str, tuple[Entry, ...]] = {}
        try:
            for name, key in segments.items():
                grown = _grown_segment(getattr(recipe, name), actual.get(key, []), values, counts, kind,
                                       added.count(kind), name)
                if grown is not None:
                    changes[name] = grown
        except NotDerivable as err:
            why = err
            continue
        if not changes:
            return [recipe]
        candidates.append(dataclasses.replace(recipe, **changes))
    if not candidates:
        raise why or NotDerivable("the longer cut adds no layers")
    return candidates


def _grown_segment(entries: tuple[Entry, ...], have: list[tuple[int, int]], values: list[int],
                   counts: dict[str, int], kind: str, times: int, name: str) -> tuple[Entry, ...] | None:
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
    if len(mine) != len(theirs) or any(m[0] != t[0] for m, t in zip(mine, theirs)):
        raise NotDerivable(f"allocations outside the layers ({name}) change with the depth in a way the added "
                           "layers do not repeat")

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
