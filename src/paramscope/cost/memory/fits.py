"""What fits where: for each accelerator, whether a peak fits and the largest batch and context that do."""

from __future__ import annotations

from ..hardware import ACCELERATORS, Accelerator
from .result import Fit


def fit_table(peak_at, reserve: int, *, batch: int, seq: int, max_context: int | None = None,
              accelerators: tuple[Accelerator, ...] = ACCELERATORS, contexts: bool = True,
              batch_step: int = 1) -> tuple[Fit, ...]:
    """For each accelerator: does the peak fit, and the largest batch (at `seq`, a multiple of `batch_step`) and
    context (at `batch`)."""
    # the searches of every accelerator walk the same doubling points, and cards of one capacity the same bisection:
    # each point is evaluated once (31 cards, 16 capacities: about a quarter of the evaluations)
    known: dict[tuple[int, int], int] = {}

    def once(b: int, s: int) -> int:
        if (b, s) not in known:
            known[b, s] = peak_at(b, s)
        return known[b, s]

    return tuple(fit_on(a, once, reserve, batch=batch, seq=seq, max_context=max_context, contexts=contexts,
                        batch_step=batch_step) for a in accelerators)


def fit_on(accelerator: Accelerator, peak_at, reserve: int, *, batch: int, seq: int,
           max_context: int | None = None, contexts: bool = True, batch_step: int = 1) -> Fit:
    """`peak_at(batch, seq)` → bytes; searched by bisection, since memory grows with both.

    The largest batch is a multiple of `batch_step`: under a pipeline its microbatches, since a batch they do not
    divide is refused (a pipeline's step cuts the batch into m equal microbatches, as torch's schedules and
    Megatron's do), and the floor B // m that the figures take would offer one that is. The largest context stops
    at the model's own maximum (`max_context`) when it has one; `contexts=False` leaves it unanswered (None), for a
    peak known at one length only."""
    capacity = accelerator.memory - reserve
    peak = peak_at(batch, seq)
    fits = peak <= capacity
    steps = _largest(lambda k: peak_at(k * batch_step, seq) <= capacity, (1 << 20) // batch_step,
                     batch // batch_step if fits else None)
    largest_batch = None if steps is None else steps * batch_step
    largest_context = _largest(lambda s: peak_at(batch, s) <= capacity, max_context or 1 << 24,
                               seq if fits and seq <= (max_context or 1 << 24) else None) if contexts else None
    return Fit(accelerator, fits, capacity - peak, largest_batch, largest_context)


def _largest(ok, limit: int, known: int | None = None) -> int | None:
    """The largest n in 1..limit with ok(n), for ok monotone decreasing; None when not even 1 fits. `known`: a
    point already known to fit (the asked batch or length), where the search starts: the points below it need not
    be answered at all (a derived step may have no recipe for one token, which reads as not fitting)."""
    if known is not None:
        low, high = known, 2 * known
    elif not ok(1):
        return None
    else:
        low, high = 1, 2
    while high <= limit and ok(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if ok(middle):
            low = middle
        else:
            high = middle
    return low
