"""--expert-load F with F·S fractional: the busiest rank receives ⌈F·B·T·k⌉ token-expert pairs, a ceiling no closed
form of B and S follows at the derivation's probe lengths (F 1.25, k 2: 43 pairs at T = 17, 48 at 19). F = p/q (two
decimals at most) is derived at lengths in multiples of q / gcd(q, k) (derive.load_unit_of), where the pairs are
F·B·T·k exactly, and answered there; another length is refused in one line. On the 5-layer Mixtral cut the derived
busiest rank equals its trace to the byte."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paramscope.cost.derived.derive import load_unit_of, seq_unit_of
from paramscope.cost.derived.symbols import NotDerivable
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.traced.expert_parallel import busiest_pairs
from paramscope.errors import UnsupportedError
from parallel_steps import small_mixtral, small_mixtral_phases

MICRO = 2


def _settings(load: float, sp_tp: int = 1) -> SimpleNamespace:  # the loaded rank's traced layout (estimate.py)
    return SimpleNamespace(layout=(2, "none", sp_tp, sp_tp > 1, 0, 2, 1, load))


def test_the_unit_makes_the_busiest_rank_pairs_whole():
    config = small_mixtral()  # top-2
    # the ceiling the probes met: 1.25 × 2·17 = 42.5 → 43, 1.25 × 2·19 = 47.5 → 48 (slope 5/2: no integer form)
    assert (busiest_pairs(34, 2, 1.25), busiest_pairs(38, 2, 1.25)) == (43, 48)
    units = {load: load_unit_of(_settings(load), config) for load in (1, 1.01, 1.25, 1.3, 1.5, 2)}
    assert units == {1: 1, 1.01: 50, 1.25: 2, 1.3: 5, 1.5: 1, 2: 1}
    for load, unit in units.items():  # at every multiple of the unit the pairs are F·T·k, linear in T
        assert all(busiest_pairs(2 * t, 2, load) * 100 == round(load * 100) * 2 * t
                   for t in range(unit, 40 * unit, unit))
    assert load_unit_of(_settings(1.3), None) == 10  # top-k unknown: the stricter q
    assert seq_unit_of(_settings(1.25, sp_tp=2), config) == 4  # sequence parallel's tp times the load's unit
    with pytest.raises(NotDerivable, match=r"expert load 1.333 = 1333/1000: .* at most two decimals") as err:
        load_unit_of(_settings(1.333), config)
    assert "\n" not in str(err.value)


# F 1.3 at 2 × 40 tokens (unit 5) also equals its trace: 8,023,872 / 7,991,856 B (not run here: CI time)
@pytest.mark.parametrize("load, seq, forward, backward", [(1.25, 32, 7_197_504, 7_179_056)])
def test_a_fractional_load_derived_equals_its_trace(cache, load, seq, forward, backward):
    """`--dp 2 --ep 2 --expert-load F`, 2 × T tokens, bf16-mixed, T a multiple of the load's unit: derived (probes at
    such lengths) and traced rank 0 equal to the byte in forward, backward and the optimizer step."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=2, ep=2, expert_load=load), seq, batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert derived == traced and (derived["forward"], derived["backward"]) == (forward, backward)
    assert any("busiest rank receives F·B·S·k token-expert pairs exactly" in n for n in device.notes)


def test_a_length_off_the_unit_is_refused_in_one_line(cache):
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    with pytest.raises(UnsupportedError, match=r"expert load 1.3: .* multiples of 5; take such a length\): 5 does "
                                               r"not divide 32") as err:
        training_answer(small_mixtral(), TrainingOptions(batch=MICRO, seq=32, precision="bf16-mixed", fits=False,
                                                         layout=ParallelLayout(dp=2, ep=2, expert_load=1.3)),
                        use_cache=False)
    assert "\n" not in str(err.value)
