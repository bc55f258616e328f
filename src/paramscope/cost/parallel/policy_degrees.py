"""The policy's FSDP2 tp rank at one shard degree from its recipe at another (the layout search's pipelines beside tp).

A pipeline beside tensor parallel under FSDP2's MixedPrecisionPolicy replays the policy's FSDP2 tp rank's derived
step (pipeline_replay.policy_rank_layout: the layout (d, "fsdp", tp, sp, …, "policy")), a derivation of three traces
for each shard degree d. The rank's recipes at two degrees differ only where FSDP2's shards are allocated: each
unit's 16-bit all-gather input (param_dtype, 2·n/d B for a unit of n tp-local parameters) and its fp32 gradient
shard (reduce_dtype, 4·n/d B, the allocation the .grad ends in), each a constant; every other allocation (the
gathered parameters, the reduce-scatter's whole input, the activations) and every segment are the same. Measured on
llama-3-70b's ranks at 2,048 tokens: tp 2 at d 2, 4, 8, 16, tp 4 at d 2, 4, 8 and tp 8 at d 2, 4 each differ from
its siblings in exactly 14 entries (the root's all-gather input and gradient shard, the cut's eight layer
all-gathers and four gradient shards), each ∝ 1/d, and each rescaled from any sibling equals its own derivation to
the byte; held on a Llama cut in tests/test_fsdp_pipeline_stage.py.

So where a sibling degree's recipe is cached (the layout search derives one a tp degree first), the asked degree's
is that recipe with those entries rescaled, not derived again. Declined (the caller derives) wherever the rule could
misread an entry: a unit whose dim 0 a degree does not divide (FSDP2 pads it), a shard size that equals a unit's
whole size at either dtype, or a constant gradient allocation that is no unit's shard."""

from __future__ import annotations

import dataclasses
from typing import Any

from .pipeline import LAYER_PREFIX
from .rules import Placement

PARAM_BYTES = 2  # the policy's param_dtype: the all-gather input, a unit's 16-bit shard
GRADIENT_BYTES = 4  # its reduce_dtype and the sharded parameters' dtype: the gradient shard

# the shard degrees a sibling is looked for at (each a cache key, ~5 ms): the search's are divisors of its device
# count, most often powers of two
SIBLING_DEGREES = tuple(sorted(set(range(2, 17)) | {2 ** k for k in range(5, 11)}))


def unit_numels(placements: tuple[Placement, ...]) -> tuple[list[int], list[tuple[int, ...]]]:
    """(each FSDP2 unit's tp-local parameter count: the root's (every parameter outside the layers) and each
    layer's, the dim-0 sizes of their parameters) as fully_shard on each layer and on the root shards them."""
    units: dict[str, int] = {}
    rows: list[tuple[int, ...]] = []
    for p in placements:
        match = LAYER_PREFIX.match(p.name)
        key = match.group(0) if match else ""
        units[key] = units.get(key, 0) + p.local_numel
        rows.append(p.local_shape[:1] or (1,))
    return [n for n in units.values() if n], rows


def rescaled(recipe: Any, placements: tuple[Placement, ...], source: int, degree: int) -> Any:
    """The recipe of the policy's FSDP2 rank at shard degree `degree`, from its recipe at `source`: each constant
    allocation that is a unit's 16-bit all-gather input (2·n/source) or, ending as a .grad, its fp32 gradient shard
    (4·n/source) resized to `degree`; None where the rule could misread an entry (the module docstring)."""
    units, rows = unit_numels(placements)
    if not units or any(row[0] % source or row[0] % degree for row in rows):
        return None  # FSDP2 pads a dim 0 the degree does not divide: the shards are not n / d
    gathers = {PARAM_BYTES * n // source: PARAM_BYTES * n // degree for n in units}
    shards = {GRADIENT_BYTES * n // source: GRADIENT_BYTES * n // degree for n in units}
    # a constant that is not a shard but has a shard's size: a unit gathered (16 bits) or its whole fp32
    # reduce-scatter input, beside a gather's size; an unsharded fp32 gradient beside a shard's (the gradient flag
    # tells a gather from a shard: at d 2 a unit's fp32 shard is its 16-bit gathered size)
    if set(gathers) & {size * n for n in units for size in (PARAM_BYTES, GRADIENT_BYTES)} \
            or set(shards) & {GRADIENT_BYTES * n for n in units}:
        return None
    sizes = list(recipe.sizes)
    moved = 0
    for index, poly in enumerate(sizes):
        if not poly or any(i or j for i, j, _ in poly) or len(poly) != 1:
            continue
        value = poly[0][2]
        table = shards if recipe.gradient[index] else gathers
        if value in table:
            sizes[index] = ((0, 0, table[value]),)
            moved += 1
        elif recipe.gradient[index]:
            return None  # a gradient that is no unit's shard: not the FSDP2 rank this rule reads
    if not moved:
        return None
    return dataclasses.replace(recipe, sizes=tuple(sizes), traced=(
        f"{recipe.traced}; FSDP2's rank at shard degree {source}, its {moved} shard allocations (each unit's 16-bit "
        f"all-gather input 2·n/d and fp32 gradient shard 4·n/d) resized to d = {degree}, every other allocation "
        "the same (parallel/policy_degrees.py)"))


def sibling_step(step: Any, placements: tuple[Placement, ...], batch: int, seq: int) -> Any:
    """`step` (a DerivedStep not yet holding a recipe, its settings the policy's FSDP2 tp rank at degree d) with
    the recipe at d: read from the cache if there, else rescaled from a sibling degree's cached recipe (rescaled);
    None where neither is cached (the caller derives it)."""
    from ..derived.derive import regime_of
    from ..derived.store import find_recipe, recipe_key

    layout = tuple(step.settings.layout)
    degree = layout[0]
    seq_range, _ = regime_of(step.config, seq, step.limit)

    def cached(shard_degree: int) -> Any:
        settings = dataclasses.replace(step.settings, layout=(shard_degree,) + layout[1:])
        return find_recipe(step.class_name, recipe_key(step.class_name, step.config, settings, batch, seq_range,
                                                       step.structure))

    if cached(degree) is not None:
        return None  # DerivedStep reads it itself
    for source in SIBLING_DEGREES:
        if source == degree:
            continue
        recipe = cached(source)
        if recipe is None:
            continue
        recipe = rescaled(recipe, placements, source, degree)
        if recipe is not None:
            step.recipes.append(recipe)
            step.from_cache += 1
            return step
    return None
