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
from ..dims import config_int, dim, text_config
from .layout import build_recipe, grow_boundaries
from .recipe import DerivedPeaks, DerivedRecipe, contexts
from .symbols import NotDerivable

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
    """Each layer's type: its modules' classes, parameters' shapes, dtypes and trainability, and plain settings (a
    sliding window, a flag), less the settings that only number the layers (layer_idx: i, or i + a constant)."""
    described = []
    for layer in layers:
        settings: dict[tuple[str, str], Any] = {}
        structure = []
        for name, sub in layer.named_modules():
            for key, value in vars(sub).items():
                if not key.startswith("_") and key != "training" and \
                        isinstance(value, (int, float, str, bool, type(None))):
                    settings[(name, key)] = value
            # whether a parameter trains is part of the type: a frozen layer keeps no gradient (a plan that freezes
            # some layers, trains the last ones)
            params = tuple((n, tuple(p.shape), str(p.dtype), bool(p.requires_grad))
                           for n, p in sub.named_parameters(recurse=False))
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
    every middle context (recipe.contexts) at least twice among its middle layers (its type's first layer once); the
    next such cut, longer, for the check; and the next (None if none), for the check of what grew from D to D'
    outside the layers. Where twice needs over 24 layers: the shortest cut holding each context once, checked on
    cuts holding each as often as the model does, up to twice."""
    count = len(types)
    wanted = set(contexts(types))

    def good(depth: int, times: int) -> bool:
        cut = contexts(types[:depth - 1] + types[-1:])
        return types[depth - 1] == types[-1] and \
            all(cut.count(c) >= (1 if c.endswith("|first") else times) for c in wanted)

    depths = [d for d in range(3, min(count, 24) + 1) if good(d, 2)]
    if len(depths) >= 2:
        return depths[0], depths[1], depths[2] if len(depths) > 2 else None
    # no short cut holds every context twice: the recipe is read from a cut holding each once, and then it cannot
    # tell what a context's layers free once from what each of them frees (a global layer's cache tensors, freed
    # by the last layer), so its check must be a cut that holds every context twice, where a wrong guess shows
    # (13-layer EXAONE-4 was 256·B·S B high, checked on cuts that only added sliding layers)
    in_model = contexts(types)

    def as_often(depth: int) -> bool:  # every context as often as the model holds it, up to twice
        cut = contexts(types[:depth - 1] + types[-1:])
        return types[depth - 1] == types[-1] and \
            all(cut.count(c) >= (1 if c.endswith("|first") else min(2, in_model.count(c))) for c in wanted)

    once = [d for d in range(3, min(count, 64) + 1) if good(d, 1)]
    checks = [d for d in range(3, min(count, 64) + 1) if as_often(d)]
    if once and any(d > once[0] for d in checks):
        check = next(d for d in checks if d > once[0])
        return once[0], check, next((d for d in checks if d > check), None)
    raise NotDerivable(f"no cut of the {count} layers ({len(set(types))} types) short enough to trace holds each "
                       "context as often as the model does, up to twice")


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
    """The range of S around `seq` in which no config threshold is crossed, and its name. S equal to a threshold is
    a regime of its own: whether a window "fills" at S = W or past it is the implementation's choice (transformers'
    sdpa takes a mask once the keys reach the window), and the recipe does not guess it. So is S = 1: a single
    query runs attention without its causal mask."""
    text = text_config(config)
    if seq == 1:  # one query: transformers' sdpa drops is_causal, torch takes other kernels
        return (1, 1), "S = 1 (a single query)"
    low, high, words = 2, limit or MAX_SEQ, []
    for key in REGIME_KEYS:
        value = config_int(text, key)
        if not value:
            continue
        if seq < value:
            high = min(high, value - 1)
            words.append(f"S < {key} {value:,}")
        elif seq == value:
            low, high = max(low, value), min(high, value)
            words.append(f"S = {key} {value:,}")
        else:
            low = max(low, value + 1)
            words.append(f"S > {key} {value:,}")
    return (low, max(low, high)), "; ".join(words) or "one regime for every S"


def batch_range_of(batch: int) -> tuple[int, int]:
    """The batches of `batch`'s regime: batch 1 alone (torch takes views a batch of several cannot), or 2 and up."""
    return (1, 1) if batch == 1 else (2, MAX_BATCH)


def sample_points(seq_range: tuple[int, int], avoid: set[int], batch_range: tuple[int, int], unit: int = 1
                  ) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two (B, S') inside the ranges whose values no config integer shares, so that no two forms of a dimension
    agree on both; S' = S / unit (S itself where unit is 1), with S' and S both clear of the config's integers."""
    low, high = -(-seq_range[0] // unit), seq_range[1] // unit
    picked: list[int] = []
    s = max(low, 17)
    while len(picked) < 2 and s <= high:
        near = {s - 2, s - 1, s, s + 1, s + 2} | {unit * s + d for d in range(-2, 3)}
        if _prime(s) and not near & avoid:
            picked.append(s)
        s += 1
    if len(picked) < 2:  # a narrow range: any two lengths in it (or the one)
        if low > high:
            raise NotDerivable(f"no length in {seq_range[0]:,}–{seq_range[1]:,} is a multiple of {unit}")
        picked = [low, min(high, low + 1)]
    batches = (1, 1) if batch_range == (1, 1) else (3, 2)
    return (batches[0], picked[0]), (batches[1], picked[1])


def _prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n ** 0.5) + 1))


def config_integers(config: Any) -> set[int]:
    """Every integer the config holds (four levels deep, 64 items a list): the values a sample length avoids."""
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


def seq_unit_of(settings: Any, config: Any = None) -> int:
    """The sequence's unit under the settings' layout: the tensor-parallel degree under sequence parallelism (a rank
    holds S / t of the tokens between its blocks); 2·cp under context parallelism (a rank holds S / cp, and torch's
    context_parallel balances the load, two chunks a rank, only where 2·cp divides S: the regime derived); times an
    uneven expert load's unit (load_unit_of), where S' = S / unit keeps the busiest rank's pairs a whole number."""
    layout = getattr(settings, "layout", None)
    unit = int(layout[2]) if layout and len(layout) > 3 and layout[3] and layout[2] > 1 else 1
    cp = int(layout[6]) if layout and len(layout) > 6 else 1
    return (unit * 2 * cp if cp > 1 else unit) * load_unit_of(settings, config)


# the loads derived: two decimals at most (F = p/q, q dividing 100), so the probes stay short
LOAD_DENOMINATOR = 100


def load_unit_of(settings: Any, config: Any = None) -> int:
    """The length unit an uneven expert load F = p/q (the layout's 8th entry, traced/expert_parallel.py) asks: the
    busiest rank receives ⌈F·B·S·k⌉ token-expert pairs, a ceiling no closed form in B and S follows (43 pairs at
    S = 17, 48 at 19 for F 1.25, k 2); at lengths that are multiples of q / gcd(q, k) it is F·B·S·k exactly, linear,
    and the recipe is derived and used only there (k, the config's top-k, 1 where unknown: a stricter unit).
    NotDerivable for a load of more than two decimals (its unit would run to thousands of tokens)."""
    import math
    from fractions import Fraction

    layout = getattr(settings, "layout", None)
    if not layout or len(layout) < 8 or layout[7] == 1:
        return 1
    load = Fraction(str(layout[7]))
    if LOAD_DENOMINATOR % load.denominator:
        raise NotDerivable(f"expert load {layout[7]:g} = {load}: the busiest rank is derived for loads of at most "
                           "two decimals (p/q, q dividing 100, so that lengths in multiples of q make its "
                           "⌈F·B·S·k⌉ pairs exact): take two decimals")
    top_k = dim(text_config(config), "top_k") if config is not None else None
    return load.denominator // math.gcd(load.denominator, top_k or 1)


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
    batch_range = batch_range_of(batch)
    regime = f"B = 1; {regime}" if batch == 1 else f"B ≥ 2; {regime}"
    unit = seq_unit_of(settings, module.config)
    loaded = load_unit_of(settings, module.config)
    if seq % unit:
        raise NotDerivable(
            f"the layout splits the sequence in units of {unit} tokens"
            + (f" (an expert load of {settings.layout[7]:g} makes the busiest rank's ⌈F·B·S·k⌉ pairs a closed form "
               f"of B and S only at lengths in multiples of {loaded}"
               f"{', times the layout' + chr(39) + 's own unit' if unit != loaded else ''}; take such a length)"
               if loaded > 1 else
               " (sequence parallel's tp, context parallel's 2·cp, where torch balances the load)")
            + f": {unit} does not divide {seq:,}")
    # the sample points are in S' = S / unit; each is traced at S = unit · S'
    at1, at2 = sample_points(seq_range, config_integers(module.config), batch_range, unit)

    # one trace per (layers, point) in a call: a regime of one point (B = 1 at S = 1, or at S = a window) samples
    # that point twice (sample_points); the module and settings are the call's own, so the second is the first
    traced: dict[tuple[int, tuple[int, int]], Any] = {}

    def trace(layers: int, at: tuple[int, int]) -> Any:
        if (layers, at) not in traced:
            cut = cut_module(module, path, layers)
            traced[(layers, at)] = record_training_step(
                cut, dataclasses.replace(settings, batch=at[0], seq=at[1] * unit), path)
        return traced[(layers, at)]

    with progress.status(f"deriving {type(module).__name__}'s training memory from traces of {depth} and "
                         f"{check_depth} layers"):
        first, second = trace(depth, at1), trace(depth, at2)
        recipe = build_recipe(first, second, at1, at2, cut_types=types[:depth - 1] + types[-1:], model_types=types,
                              seq_range=seq_range, batch_range=batch_range, regime=regime)
        recipe = dataclasses.replace(recipe, seq_unit=unit)
        check_at = (batch, seq // unit) if recipe.covers(batch, seq) else \
            (batch_range[0], -(-seq_range[0] // unit))
        check = trace(check_depth, check_at)
        candidates = grow_boundaries(recipe, check, types[:check_depth - 1] + types[-1:], check_at)
        checks = [(check_depth, check_at, check)]
        if candidates != [recipe]:  # what grew was read from the check: a longer cut checks it
            if third_depth is None and check_depth == count:  # the check is the whole model: a second point at
                # its depth checks what grew (a shallow model, GPT-2 cut to 4 layers: no longer cut exists)
                third_depth = check_depth
            if third_depth is None:
                raise NotDerivable("allocations outside the layers grow with the depth, and no longer cut checks them")
            third_at = at1 if check_at != at1 else at2
            checks.append((third_depth, third_at, trace(third_depth, third_at)))

    def mismatch(candidate: DerivedRecipe) -> str | None:
        for layers, (b, s), timeline in checks:
            at = (b, s * unit)
            predicted = candidate.peaks(*at, layer_types=types[:layers - 1] + types[-1:])
            measured = DerivedPeaks(*timeline.peaks(), predicted.gradients_at_backward_peak)
            if predicted != measured:
                return (f"the recipe from {depth} layers gives {predicted.forward:,} / {predicted.backward:,} B for "
                        f"{layers} layers at B={at[0]}, S={at[1]}, the trace {measured.forward:,} / "
                        f"{measured.backward:,} B")
        return None

    failures = [mismatch(candidate) for candidate in candidates]
    if all(failures):
        raise NotDerivable(failures[0])
    recipe = candidates[failures.index(None)]
    words = "; ".join(f"{layers} layers at B={at[0]}, S={at[1] * unit}: forward peak {t.peaks()[0]:,} B, backward "
                      f"peak {t.peaks()[2]:,} B" for layers, at, t in checks)
    grew = " (what the step builds per layer outside the layers, such as a cache layer's tensors, read from the " \
        "first check)" if len(checks) > 1 else ""
    assumed = "".join(f"; {note}" for note in first.notes)
    return dataclasses.replace(
        recipe,
        traced=(f"traced at {depth} layers, B={at1[0]}, S={at1[1] * unit} and B={at2[0]}, S={at2[1] * unit} (fake "
                f"tensors, every allocation and free){grew}{assumed}"
                + (f"; sizes in S' = S / {unit}" + _unit_words(settings, unit, loaded) if unit > 1 else "")),
        check=f"checked against a trace of {words}, equal to the byte")


def _unit_words(settings: Any, unit: int, loaded: int) -> str:
    """Why the recipe's sizes are in S' = S / unit: the layout's tokens a rank (sequence or context parallel), an
    expert load's length unit, or both."""
    words: list[str] = []
    if unit > loaded:
        words.append("the tokens a rank holds under sequence parallelism" if len(settings.layout) < 7 or
                     settings.layout[6] == 1 else "S / (2·cp): a context-parallel rank holds two chunks of S' tokens")
    if loaded > 1:
        words.append(f"lengths in multiples of {loaded}, where expert load {settings.layout[7]:g}'s busiest rank "
                     "receives F·B·S·k token-expert pairs exactly (no rounding up)")
    return ", " + "; ".join(words)
