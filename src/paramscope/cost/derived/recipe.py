"""A derived memory recipe: the training step's allocations as closed forms in B and S, per layer type.

The step of an L-layer model is laid out as its traced cut's was, with the middle layers repeated:

    forward:   prefix · first layer · middle layers (each its type's) · last layer (with the head and the loss)
    backward:  the loss's and head's backward · last layer · middle layers, last to first · first layer (and the rest)

Each segment is a list of allocations (+ size) and frees (− size), sizes being polynomials in B and S. A free that the
boundary makes for every middle layer of a type (autocast's weight copies, released when the forward ends) counts once
per such layer. Replaying the list gives each moment's bytes above the step's start, hence the forward's peak, what the
forward leaves for backward and the backward's peak, exactly for any B and S in the recipe's regime and any depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ...frozen import FrozenDict, freeze_fields
from .symbols import Poly, evaluate

# (sign, allocation, multiplier): sign +1 allocates, −1 frees; multiplier None counts once, a middle layer's context
# (contexts below) counts once per middle layer in that context, and "+TYPE" once per layer of that type beyond the
# traced cut's (an object per layer that the step builds before the first layer runs, such as a cache layer's)
Entry = tuple[int, int, "str | None"]


def contexts(types: Sequence[str]) -> tuple[str, ...]:
    """Each middle layer's context: its type between its neighbours' (what a layer frees of its neighbour's, the
    neighbour's type decides), and whether it is its type's first layer (the last to run backward, which frees what
    the layers of its type shared)."""
    seen: set[str] = set()
    found = []
    for i in range(1, len(types) - 1):
        first = types[i] not in seen and types[i] not in types[:i]
        seen.add(types[i])
        found.append("|".join(types[i - 1:i + 2]) + ("|first" if first else ""))
    return tuple(found)


def multipliers(types: Sequence[str], cut_types: Sequence[str]) -> dict[str, int]:
    """How many times each multiplier counts for a model of `types`, laid out from a cut of `cut_types`."""
    middle = contexts(types)
    counts: dict[str, int] = {c: middle.count(c) for c in set(middle)}
    for kind in set(types) | set(cut_types):
        counts["+" + kind] = list(types).count(kind) - list(cut_types).count(kind)
    return counts


@dataclass(frozen=True)
class DerivedPeaks:
    forward: int  # the forward's peak, bytes above the step's start
    end_of_forward: int  # live when the loss is computed: what backward reads (the saved activations and the loss)
    backward: int  # the backward's peak, above the step's start (gradients included)
    gradients_at_backward_peak: int


@dataclass(frozen=True)
class DerivedRecipe:
    sizes: tuple[Poly, ...]  # each allocation's bytes
    gradient: tuple[bool, ...]  # each allocation ends as a parameter's .grad
    prefix: tuple[Entry, ...]
    first_forward: tuple[Entry, ...]
    middle_forward: FrozenDict[str, tuple[Entry, ...]]  # a middle layer's context (its neighbours' types) → segment
    last_forward: tuple[Entry, ...]
    head_backward: tuple[Entry, ...]
    last_backward: tuple[Entry, ...]
    middle_backward: FrozenDict[str, tuple[Entry, ...]]
    first_backward: tuple[Entry, ...]
    layer_types: tuple[str, ...]  # the model's layers, each's type
    cut_types: tuple[str, ...]  # the traced cut's
    seq_range: tuple[int, int]  # the regime: S from, to (inclusive)
    batch_range: tuple[int, int]  # and B
    regime: str  # the regime in words
    traced: str  # how it was derived, in words
    check: str  # the check before use, in words
    # the sizes are polynomials in S / seq_unit: under sequence parallelism a rank holds S / t of the tokens, a
    # dimension no integer form of S gives, so the recipe is derived in S' = S / t from traces at multiples of t
    seq_unit: int = 1

    def __post_init__(self) -> None:
        freeze_fields(self, "middle_forward", "middle_backward")

    def covers(self, batch: int, seq: int) -> bool:
        return self.seq_range[0] <= seq <= self.seq_range[1] and self.batch_range[0] <= batch <= self.batch_range[1] \
            and seq % self.seq_unit == 0

    def peaks(self, batch: int, seq: int, layer_types: Sequence[str] | None = None) -> DerivedPeaks:
        """The step's figures at `batch` × `seq` for the model's layers (or `layer_types`, a cut's)."""
        import numpy as np

        laid = self._laid_out(layer_types)
        values = self._values(batch, seq)
        if values.dtype == np.int64 and laid.bound * int(np.abs(values).max(initial=0)) < 1 << 62:
            # every running sum stays within int64: the fast path (a fit table evaluates hundreds of points)
            forward = laid.forward_sign_int * values[laid.forward_index]
            backward = laid.backward_sign_int * values[laid.backward_index]
        else:
            forward = (laid.forward_sign * values.astype(object)[laid.forward_index]).astype(np.int64)
            backward = (laid.backward_sign * values.astype(object)[laid.backward_index]).astype(np.int64)
        live = np.cumsum(forward)
        forward_peak = max(0, int(live.max())) if live.size else 0
        end = int(live[-1]) if live.size else 0
        after = end + np.cumsum(backward)
        if not after.size or int(after.max()) <= end:
            return DerivedPeaks(forward_peak, end, end, 0)
        at = int(np.argmax(after))
        gradients = int(np.cumsum(np.where(laid.backward_gradient, backward, 0))[at])
        return DerivedPeaks(forward_peak, end, int(after[at]), gradients)

    def later_backward(self, batch: int, seq: int) -> int:
        """A later micro-step's backward peak under gradient accumulation, above its start and the gradients held
        from the earlier micro-steps: the same replay, but each allocation that ends as a parameter's .grad is made
        beside the held one and added into it by AccumulateGrad once its node returns, so it is live through the
        allocations that follow it in that node (up to the next free: the node's saved tensors and inputs released),
        not to the step's end."""
        import numpy as np

        laid = self._laid_out(None)
        values = self._values(batch, seq).astype(object)
        live = np.cumsum((laid.forward_sign * values[laid.forward_index]).astype(np.int64))
        end = int(live[-1]) if live.size else 0
        backward = (laid.backward_sign * values[laid.backward_index]).astype(np.int64)
        made = np.where(laid.backward_gradient & (backward > 0), backward, 0)
        after = end + np.cumsum(backward - made)
        new = np.cumsum(made)  # the new gradients made so far, less those added in before the last free
        in_flight = new - np.maximum.accumulate(np.where(backward < 0, new, 0)) if new.size else new
        return max(end, int((after + in_flight).max(initial=end)))

    def words(self, phase: str, batch: int, seq: int) -> str:
        """The phase's peak moment as its closed form: "what is live: 24·B·S² + … B (L layers folded in)"."""
        from .symbols import words

        moment = "at the end of the forward" if phase == "end of forward" else f"at the {phase} peak"
        unit = f"; S' = S / {self.seq_unit} = {seq // self.seq_unit:,}" if self.seq_unit > 1 else ""
        text = words(self.moment(batch, seq, phase))
        if self.seq_unit > 1:
            text = text.replace("S", "S′")
        return f"live {moment}: {text} B ({self.regime}{unit})"

    def moment(self, batch: int, seq: int, phase: str) -> Poly:
        """What is live at `phase`'s peak ("forward", "end of forward", "backward") at `batch` × `seq`, as a
        polynomial in B and S (the model's depth folded into the coefficients)."""
        import numpy as np

        laid = self._laid_out(None)
        values = self._values(batch, seq).astype(object)
        forward = laid.forward_sign * values[laid.forward_index]
        live = np.cumsum(forward.astype(np.int64))
        if phase == "forward":
            rows = [(laid.forward_sign[:k + 1], laid.forward_index[:k + 1]) for k in [int(np.argmax(live))]]
        else:
            rows = [(laid.forward_sign, laid.forward_index)]
            if phase == "backward":
                backward = (laid.backward_sign * values[laid.backward_index]).astype(np.int64)
                after = np.cumsum(backward)
                if after.size and int(after.max()) > 0:
                    k = int(np.argmax(after))
                    rows.append((laid.backward_sign[:k + 1], laid.backward_index[:k + 1]))
        terms: dict[tuple[int, int], int] = {}
        for signs, indices in rows:
            weight: dict[int, int] = {}
            for sign, index in zip(signs.tolist(), indices.tolist()):
                weight[index] = weight.get(index, 0) + sign
            for index, times in weight.items():
                for i, j, c in self.sizes[index]:
                    terms[(i, j)] = terms.get((i, j), 0) + times * c
        return tuple(sorted((i, j, c) for (i, j), c in terms.items() if c))

    def held_after_forward(self, batch: int, seq: int) -> tuple[tuple[Poly, int, int], ...]:
        """What the forward makes and leaves live when it ends, for the model's layers: (an allocation's size as a
        polynomial in B and S / seq_unit, its bytes at `batch` × `seq`, how many of it are live), each allocation
        whose net count over the forward is above zero (one at or below zero is not the forward's: a free of what
        the step started with)."""
        laid = self._laid_out(None)
        values = self._values(batch, seq)
        net: dict[int, int] = {}
        for sign, index in zip(laid.forward_sign.tolist(), laid.forward_index.tolist()):
            net[index] = net.get(index, 0) + int(sign)
        return tuple((self.sizes[index], int(values[index]), times) for index, times in sorted(net.items())
                     if times > 0)

    def _memo(self) -> dict[Any, Any]:
        """This recipe's own cache (its layouts by layer types, its coefficient matrix): kept on the instance, out
        of the fields, so equality and the JSON never see it."""
        memo = self.__dict__.get("_cache")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_cache", memo)
        return memo

    def _values(self, batch: int, seq: int) -> Any:
        """Every allocation's bytes at `batch` × `seq`: the coefficient matrix times the monomials, as int64, or as
        Python integers where int64 could overflow."""
        import numpy as np

        seq //= self.seq_unit
        memo = self._memo()
        matrix = memo.get("values")
        if matrix is None:
            monomials = sorted({(i, j) for poly in self.sizes for i, j, _ in poly})
            column = {m: k for k, m in enumerate(monomials)}
            coefficients = np.zeros((len(self.sizes), len(monomials)), dtype=np.int64)
            for row, poly in enumerate(self.sizes):
                for i, j, c in poly:
                    coefficients[row, column[(i, j)]] = c
            matrix = memo["values"] = (monomials, coefficients)
        monomials, coefficients = matrix
        powers = [batch ** i * seq ** j for i, j in monomials]
        if max(powers, default=0) * int(np.abs(coefficients).max(initial=0)) * max(len(monomials), 1) < 1 << 62:
            return coefficients @ np.array(powers, dtype=np.int64)
        return np.array([evaluate(poly, batch, seq) for poly in self.sizes], dtype=object)

    def _laid_out(self, layer_types: Sequence[str] | None) -> "_Layout":
        import numpy as np

        types = tuple(self.layer_types if layer_types is None else layer_types)
        memo = self._memo()
        cached = memo.get(types)
        if cached is not None:
            return cached
        middle = contexts(types)
        counts = multipliers(types, self.cut_types)

        def arrays(segments: list[tuple[Entry, ...]]) -> tuple[Any, Any]:
            entries = [e for segment in segments for e in segment]
            sign = np.array([e[0] * (1 if e[2] is None else counts.get(e[2], 0)) for e in entries], dtype=object)
            index = np.array([e[1] for e in entries], dtype=np.int64)
            return sign, index

        forward = [self.prefix, self.first_forward, *(self.middle_forward[t] for t in middle), self.last_forward]
        backward = [self.head_backward, self.last_backward, *(self.middle_backward[t] for t in reversed(middle)),
                    self.first_backward]
        forward_sign, forward_index = arrays(forward)
        backward_sign, backward_index = arrays(backward)
        gradient = np.array(self.gradient, dtype=bool)
        # the largest sum of |multipliers| a running total can gather: int64 arithmetic is exact below 2^62 / bound
        bound = sum(abs(int(x)) for x in forward_sign) + sum(abs(int(x)) for x in backward_sign) + 1
        laid = _Layout(forward_sign, forward_index, backward_sign, backward_index,
                       gradient[backward_index] if backward_index.size else np.zeros(0, dtype=bool),
                       forward_sign.astype(np.int64), backward_sign.astype(np.int64), bound)
        if len(memo) > 64:
            memo.clear()
        memo[types] = laid
        return laid


@dataclass(frozen=True)
class _Layout:
    forward_sign: Any
    forward_index: Any
    backward_sign: Any
    backward_index: Any
    backward_gradient: Any
    forward_sign_int: Any  # the signs as int64, for the fast path
    backward_sign_int: Any
    bound: int  # the sum of every |sign|: a running total is at most bound × the largest allocation




# ------------------------------------------------------------------------------------------------ JSON (the cache)

_SEGMENTS = ("prefix", "first_forward", "last_forward", "head_backward", "last_backward", "first_backward")
MAX_ALLOCATIONS = 200_000


def recipe_to_json(recipe: DerivedRecipe) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sizes": [[list(term) for term in poly] for poly in recipe.sizes],
        "gradient": [int(g) for g in recipe.gradient],
        "middle_forward": {k: [list(e) for e in v] for k, v in recipe.middle_forward.items()},
        "middle_backward": {k: [list(e) for e in v] for k, v in recipe.middle_backward.items()},
        "layer_types": list(recipe.layer_types), "cut_types": list(recipe.cut_types),
        "seq_range": list(recipe.seq_range), "batch_range": list(recipe.batch_range),
        "regime": recipe.regime, "traced": recipe.traced, "check": recipe.check, "seq_unit": recipe.seq_unit,
    }
    for name in _SEGMENTS:
        data[name] = [list(e) for e in getattr(recipe, name)]
    return data


def recipe_from_json(data: Any) -> DerivedRecipe:
    """The recipe in `data`, every field checked (disk_cache.CacheEntryError names the first that is wrong)."""
    from ...disk_cache import expect, is_int

    expect(isinstance(data, dict), "a derived recipe is a JSON object")
    sizes = data.get("sizes")
    expect(isinstance(sizes, list) and len(sizes) <= MAX_ALLOCATIONS, "sizes: a list of allocations")
    polys = []
    for poly in sizes:
        expect(isinstance(poly, list) and len(poly) <= 16 and all(
            isinstance(t, list) and len(t) == 3 and all(is_int(x) for x in t) and 0 <= t[0] <= 4 and 0 <= t[1] <= 4
            and abs(t[2]) < (1 << 48) for t in poly), "sizes: each a list of [i, j, c] terms")
        polys.append(tuple(tuple(t) for t in poly))
    gradient = data.get("gradient")
    expect(isinstance(gradient, list) and len(gradient) == len(polys) and all(g in (0, 1) for g in gradient),
           "gradient: one 0 or 1 per allocation")
    types = data.get("layer_types")
    cut = data.get("cut_types")
    expect(isinstance(types, list) and 3 <= len(types) <= 1 << 14 and all(isinstance(t, str) and len(t) < 64
                                                                            for t in types), "layer_types")
    expect(isinstance(cut, list) and 3 <= len(cut) <= 256 and all(t in types for t in cut), "cut_types")
    keys = set(contexts(types)) | {"+" + t for t in types}

    def entries(value: Any, what: str) -> tuple[Entry, ...]:
        expect(isinstance(value, list) and len(value) <= 4 * MAX_ALLOCATIONS, f"{what}: a list of entries")
        out = []
        for e in value:
            expect(isinstance(e, list) and len(e) == 3 and e[0] in (1, -1) and is_int(e[1])
                   and 0 <= e[1] < len(polys) and (e[2] is None or e[2] in keys | set(contexts(cut))),
                   f"{what}: each entry [±1, allocation, multiplier]")
            out.append((e[0], e[1], e[2]))
        return tuple(out)

    middle = {}
    for name in ("middle_forward", "middle_backward"):
        value = data.get(name)
        expect(isinstance(value, dict) and set(contexts(types)) <= set(value) and len(value) <= 256,
               f"{name}: a segment for every middle context")
        middle[name] = {k: entries(v, name) for k, v in value.items()}
    ranges = {}
    for name in ("seq_range", "batch_range"):
        value = data.get(name)
        expect(isinstance(value, list) and len(value) == 2 and all(is_int(v) and v >= 1 for v in value)
               and value[0] <= value[1], f"{name}: [from, to]")
        ranges[name] = (value[0], value[1])
    words = {}
    for name in ("regime", "traced", "check"):
        value = data.get(name)
        expect(isinstance(value, str) and len(value) <= 2000, f"{name}: text")
        words[name] = value
    unit = data.get("seq_unit", 1)
    expect(is_int(unit) and 1 <= unit <= 1 << 10, "seq_unit: a whole number from 1 to 1,024")
    return DerivedRecipe(sizes=tuple(polys), gradient=tuple(bool(g) for g in gradient),
                         **{name: entries(data.get(name), name) for name in _SEGMENTS},
                         **middle, layer_types=tuple(types), cut_types=tuple(cut), **ranges, **words, seq_unit=unit)
