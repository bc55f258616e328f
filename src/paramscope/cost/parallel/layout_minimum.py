"""The fewest devices whose layouts (at the same global batch) fit, every count from 1 up to `limit` (16 × N).

A count whose model states alone, spread evenly over all its devices, exceed the GPU is passed over without a layout
tried (no layout can beat the even spread): the counts below `floor`. The others' layouts are tried, lowest lower
bound first (ties: most model-parallel first), until one fits; those whose bound exceeds the GPU are passed over
unevaluated (they cannot fit: the bound is part of their peak). Powers of two first (and N, already answered): the
first that fits bounds the answer from above; then every count below it, upward from the floor, until one fits. A
count that does not fit costs all its layouts under the GPU on their bound, so this second pass stops once it has
evaluated MIN_BUDGET layouts: the answer is then the power of two, and the counts left are named (Llama-3.1-405B on
H100s: 160 devices, 58 layouts evaluated and 637 passed over below it, where every layout of every count cost
minutes)."""

from __future__ import annotations

from .layout import MAX_DEGREE
from .layout_candidates import candidate_layouts, likely_first
from .layout_evaluation import LayoutEvaluator
from .search_result import Candidate, DeviceCount, Minimum, Skipped

MIN_BEYOND = 16  # the fewest devices are sought up to 16 × N
MIN_BUDGET = 1024  # layouts the fewest devices' search evaluates below the first power of two that fits, at most
# (those passed over on their lower bound cost nothing and are not counted)


def fewest_devices(evaluator: LayoutEvaluator, states_bytes: int, fitting: tuple[Candidate, ...], at_n: int,
                   unanswered_at_n: int, bounded_at_n: int) -> Minimum | None:
    """The Minimum; None where a layout's memory needs the build. `states_bytes`: the model states on one device;
    `fitting`, `at_n`, `unanswered_at_n`, `bounded_at_n`: N's layouts that fit, those answered, those not answered
    and those passed over on their bound."""
    devices = evaluator.facts.options.devices
    limit = min(MAX_DEGREE, MIN_BEYOND * devices)
    capacity = evaluator.facts.capacity
    floor = max(1, -(-states_bytes // capacity)) if capacity > 0 else limit + 1
    counts = _Counts(evaluator, devices, fitting, at_n, unanswered_at_n, bounded_at_n)
    probes = sorted({1 << k for k in range(limit.bit_length()) if floor <= 1 << k <= limit}
                    | ({devices} if floor <= devices <= limit else set()))
    bound = None
    for count in probes:
        if counts.look(count, budgeted=False) is None:
            return None
        if count in counts.found:
            bound = count
            break
    top = bound if bound is not None else limit + 1
    untried = None
    for count in range(floor, top):
        if count in counts.tried:
            continue
        outcome = counts.look(count, budgeted=True)
        if outcome is None:
            return None
        if outcome is False:  # the budget ran out inside this count: it and the rest below the bound are open
            untried = (count, top - 1)
            break
        if count in counts.found:
            break
    fewest = min(counts.found) if counts.found else None
    listed = tuple(counts.tried[c] for c in sorted(counts.tried) if fewest is None or c <= fewest)
    return Minimum(fewest, counts.found.get(fewest) if fewest is not None else None, limit, listed,
                   min(floor, limit + 1), untried, MIN_BUDGET, counts.bounded,
                   sum(t.unanswered for t in listed if t.devices != fewest))


class _Counts:
    """Each device count looked at: how it went (`tried`), the first layout found to fit (`found`), the layouts the
    second pass evaluated (`spent`, against MIN_BUDGET) and those passed over on their bound (`bounded`)."""

    def __init__(self, evaluator: LayoutEvaluator, devices: int, fitting: tuple[Candidate, ...], at_n: int,
                 unanswered_at_n: int, bounded_at_n: int) -> None:
        self.evaluator = evaluator
        self.devices, self.fitting, self.at_n, self.unanswered_at_n = devices, fitting, at_n, unanswered_at_n
        self.tried: dict[int, DeviceCount] = {}
        self.found: dict[int, Candidate] = {}
        self.spent = 0
        self.bounded = bounded_at_n

    def look(self, count: int, budgeted: bool) -> bool | None:
        """Try one count; False where the second pass's budget ran out inside it, None where the build is needed."""
        if count == self.devices:
            self._answered_at_n()
            return True
        evaluator, capacity = self.evaluator, self.evaluator.facts.capacity
        layouts, _ = candidate_layouts(evaluator.facts, count)
        # passed over on the bound, tried in the bound's order (a derived class's by its states: layout_bound.order)
        ranked = [(evaluator.bound(layout, replica), evaluator.lower_bound.order(layout, replica), i, layout, replica)
                  for i, (layout, replica) in enumerate(likely_first(layouts))]
        hopeless = sum(1 for b, *_ in ranked if b > capacity)
        self.bounded += hopeless
        done = skipped = 0
        for _, _, _, layout, replica in sorted((item for item in ranked if item[0] <= capacity),
                                               key=lambda item: item[1:3]):
            if budgeted:
                if self.spent >= MIN_BUDGET:
                    return False
                self.spent += 1
            result = evaluator.evaluate(layout, replica)
            if result is None:
                return None
            if isinstance(result, Skipped):
                skipped += 1
                continue
            done += 1
            if result.fits:
                self.tried[count] = DeviceCount(count, "fits", done, f"{result.layout.words()} fits", skipped)
                self.found[count] = result
                return True
        if not layouts:
            self.tried[count] = DeviceCount(count, "no layout", done, "no layout divides the global batch", skipped)
            return True
        aside = ", ".join(part for part in (f"{hopeless} passed over on their bound" if hopeless else "",
                                            f"{skipped} not answered" if skipped else "") if part)
        self.tried[count] = DeviceCount(count, "none fits", done, f"none of its {len(layouts)} layouts fits"
                                        + (f" ({aside})" if aside else ""), skipped)
        return True

    def _answered_at_n(self) -> None:
        """N's layouts were all evaluated already: its count from them."""
        count, at_n, unanswered = self.devices, self.at_n, self.unanswered_at_n
        if self.fitting:
            self.tried[count] = DeviceCount(count, "fits", at_n, f"{len(self.fitting)} of its layouts fit", unanswered)
            self.found[count] = self.fitting[0]
        else:
            aside = f" ({unanswered:,} not answered)" if unanswered else ""
            self.tried[count] = DeviceCount(count, "none fits", at_n, f"none of its {at_n} answered layouts "
                                                                      f"fits{aside}", unanswered)
