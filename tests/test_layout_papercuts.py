"""A newcomer's papercuts with layouts (issue 28's trial): each refused, pointed or worded at its root."""

from __future__ import annotations

import pytest

from paramscope.cli import main
from paramscope.errors import OptionError


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- --schedule interleaved needs its chunks ----------------------------------------------------------------------

def test_interleaved_without_virtual_stages_is_refused_naming_the_flag(capsys):
    code, out, err = _cli(capsys, "memory", "llama-3-8b", "--training", "--dp", "2", "--pp", "2", "--schedule",
                          "interleaved")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--schedule interleaved needs --virtual-stages V ≥ 2" in err
    assert "torchtitan takes 2" in err  # the usual value, not taken silently


def test_interleaved_with_one_chunk_is_refused_in_the_library_too():
    from paramscope.cost.parallel.layout import ParallelLayout, layout_for

    for make in (lambda: layout_for(dp=2, pp=2, schedule="interleaved"),
                 lambda: layout_for(dp=2, pp=2, schedule="interleaved", virtual_stages=1),
                 lambda: ParallelLayout(pp=2, micro_batches=2, schedule="interleaved").check()):
        with pytest.raises(OptionError, match="schedule interleaved needs virtual_stages V ≥ 2"):
            make()
    assert layout_for(dp=2, pp=2, schedule="interleaved", virtual_stages=2, batch=2).virtual_stages == 2


# --- flops reads --devices N as memory does ----------------------------------------------------------------------

def test_flops_step_seconds_with_devices_alone_is_dp_and_says_so(capsys):
    base = ["flops", "llama-3-8b", "--training", "--seq", "1024", "--step-seconds", "2", "--gpu", "h100",
            "--width", "100"]
    code, as_devices, _ = _cli(capsys, *base, "--devices", "8")
    code_dp, as_dp, _ = _cli(capsys, *base, "--dp", "8")
    assert code == code_dp == 0
    said = ("  note: --devices 8 read as dp 8 (data-parallel replicas), as memory reads it: --step-seconds is one\n"
            "  step of a layout\n")
    assert said in as_devices and "One device: dp 8 = 8 devices" in as_devices
    assert as_devices.replace(said, "") == as_dp  # the same answer, MFU per device included; only the note added


# --- --devices N --zero 3 is the layout --dp N --zero 3: one answer, the gathered buffers counted -----------------

def test_devices_zero3_and_dp_zero3_give_one_answer_and_say_so(capsys):
    base = ["memory", "llama-3-8b", "--training", "--zero", "3", "--width", "100"]
    code, flat, _ = _cli(capsys, *base, "--devices", "8")
    code_dp, layout, _ = _cli(capsys, *base, "--dp", "8")
    assert code == code_dp == 0 and flat == layout
    assert "One device (rank 0, the largest share): dp 8 (ZeRO-3) = 8 devices" in layout
    # the gathered buffers, to the byte: one layer's weights (436,224,000) and the head's (1,050,673,152), in bf16
    # (ZeRO's default precision is DeepSpeed's bf16, bf16-master)
    assert "--devices 8 --zero 3 is this layout and gives this answer, the gathered buffers above counted " \
           "(1,486,897,152 B at the peak" in " ".join(layout.split())
    assert 1_486_897_152 == 436_224_000 + 1_050_673_152
    code, zero1, _ = _cli(capsys, *base[:3], "--zero", "1", "--devices", "8", "--width", "100")
    assert code == 0 and "flat shares" not in zero1  # ZeRO-1 and -2: both answers agree, nothing to point at


# --- words: bytes past 1,000 of a unit, a throughput's thousands -------------------------------------------------

def test_bytes_reach_the_next_unit_at_1000_of_their_own():
    from paramscope.render.memory import binary

    assert binary(999) == "999 B" and binary(1000) == "0.98 KiB"
    assert binary(1_048_596_971) == "0.98 GiB"  # 1000.02 MiB
    assert binary(1_048_569_708) == "999.99 MiB" and binary(1_048_571_805) == "0.98 GiB"  # not '1000.00 MiB'
    assert binary(2**30) == "1.00 GiB" and binary(5 * 2**40) == "5.00 TiB"


def test_a_throughput_is_written_with_its_thousands(capsys):
    code, text, _ = _cli(capsys, "flops", "llama-3-8b", "--training", "--dp", "8", "--tokens-per-second", "3000",
                         "--gpu", "h100", "--width", "100")
    assert code == 0 and "÷ 3,000 tokens/s" in " ".join(text.split()) and "3000" not in text


# --- --gpu: the nearest names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("typed, offered", [("h1OO", "did you mean 'h100-80gb', 'h200' or 'h100-nvl'? known: "),
                                            ("mi3OOx", "did you mean 'mi300x'? known: "),
                                            ("b20", "did you mean 'b200'? known: ")])
def test_a_mistyped_gpu_gets_the_nearest_names_in_one_line(capsys, typed, offered):
    code, out, err = _cli(capsys, "memory", "gpt2", "--gpu", typed)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"paramscope: error: unknown accelerator {typed!r}; {offered}")


def test_a_name_near_nothing_gets_no_guess():
    from paramscope.cost.hardware import find_accelerator

    with pytest.raises(OptionError) as caught:
        find_accelerator("hundred")
    assert "did you mean" not in str(caught.value)


# --- the estimates' one line says whose peak it is under a layout ------------------------------------------------

def test_the_serving_and_training_reprs_say_the_layout():
    import paramscope

    serving = paramscope.estimate_memory("gpt2", paramscope.MemoryOptions(tp=2, seq=128))
    assert serving.peak == serving.parallel.layout.peak
    assert "peak 260,793,344 B (0.24 GiB) on the fullest GPU of tp 2 = 2 GPUs in prefill" in repr(serving)
    alone = paramscope.estimate_memory("gpt2", paramscope.MemoryOptions(seq=128))
    assert " GPU of " not in repr(alone)
    flat = paramscope.estimate_training("llama-3-8b", paramscope.TrainingOptions(devices=8, zero="3",
                                                                                          precision="bf16-mixed"))
    assert "peak 46,139,325,082 B (42.97 GiB) on each of 8 devices (ZeRO-3's flat shares) in backward" in repr(flat)
    layout = paramscope.estimate_training("llama-3-8b", paramscope.TrainingOptions(
        layout=paramscope.layout_for(dp=8, zero="3"), precision="bf16-mixed"))
    assert "peak 49,113,119,386 B (45.74 GiB) on the fullest device of dp 8 (ZeRO-3) = 8 devices in backward" \
        in repr(layout)


# --- the rules table says what a layout without tp does to each role ---------------------------------------------

def test_the_rules_say_what_a_layout_without_tp_does_to_each_role():
    import paramscope
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.parallel.rules import ModelShape, place, rules_in_words

    report = paramscope.inspect("mixtral-8x7b")  # its template: the real module names and roles, no build
    shape = ModelShape(hidden=4096, heads=32, kv_heads=8, conv1d=False)  # Mixtral-8x7B's config

    def words(**degrees):
        layout = layout_for(**degrees)
        return rules_in_words(place(report.params, shape, tp=layout.tp, ep=layout.ep), layout)

    ep = words(dp=8, ep=8)
    assert ep["moe.experts"] == "whole; experts / ep 8"
    assert ep["attention.query"] == ep["moe.router"] == "whole (ep 8 cuts only the routed experts)"
    assert set(words(dp=2, cp=2).values()) == {"whole; the sequence split cp 2"}
    assert set(words(dp=2, pp=2, batch=2).values()) == {"whole (no tensor parallelism)"}  # nothing cut: as before
    every = words(dp=4, tp=2, cp=2, ep=2)
    assert every["attention.query"] == "column-parallel (output features / 2); the sequence split cp 2"
    assert every["moe.experts"] == ("gate and up column-parallel (intermediate / 2 of each expert), down row-parallel "
                                    "(input features / 2); experts / ep 2; the sequence split cp 2")
