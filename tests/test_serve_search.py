"""serve runs memory's smallest tensor-parallel search only where the asked batch (or its prefill) does not fit one
GPU: a fitting answer makes none, and the GPU is looked up once."""

from __future__ import annotations

import paramscope
from paramscope.cost import hardware
from paramscope.cost.parallel import serving


def test_a_batch_that_fits_makes_no_search_and_one_lookup(monkeypatch):
    def no_search(*args, **kwargs):
        raise AssertionError("the smallest tensor-parallel search ran for a batch that fits")

    lookups = []
    find = hardware.find_accelerator

    def counted(name, *args, **kwargs):
        lookups.append(name)
        return find(name, *args, **kwargs)

    monkeypatch.setattr(serving, "smallest_tp", no_search)
    monkeypatch.setattr(hardware, "find_accelerator", counted)
    monkeypatch.setattr("paramscope.cost.speed.answer.find_accelerator", counted)
    speed = paramscope.estimate_serving("gpt2", paramscope.ServeOptions(gpu="h100"))
    assert all(step.fits for step in speed.decode) and speed.prefill.fits
    assert lookups == ["h100"]
