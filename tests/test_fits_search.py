"""fits.fit_on: the largest batch and context start from the asked point where it fits, so points below it that an
engine does not answer (a derived step with no recipe at one token reads as not fitting) cannot hide an answer."""

from __future__ import annotations

from paramscope.cost.hardware import Accelerator
from paramscope.cost.memory.fits import fit_on

GPU = Accelerator("budget", 1_000, "", "budget")


def peak_at(batch: int, seq: int) -> int:
    if seq < 64:  # a regime the engine does not answer: the sentinel it gives reads as not fitting
        return 1 << 62
    return batch * seq


def test_the_asked_point_fits_so_the_search_starts_there():
    fit = fit_on(GPU, peak_at, 0, batch=2, seq=100, max_context=4_096)
    assert fit.fits and fit.free == 800
    assert fit.largest_batch == 10 and fit.largest_context == 500


def test_where_the_asked_point_does_not_fit_the_search_starts_at_one():
    fit = fit_on(GPU, lambda b, s: b * s, 0, batch=4, seq=400, max_context=4_096)
    assert not fit.fits and fit.largest_batch == 2 and fit.largest_context == 250
