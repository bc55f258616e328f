"""--fsdp-mixed-precision policy: FSDP2's own MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) with no
autocast, as torchtitan runs FSDP2, beside today's default (torch.autocast over the fp32 parameters). The rank's
step is derived from cuts traced with the policy applied (the policy is part of the recipe's key) and equals the
rank traced by MemTracker to the byte; where the policy does not apply it is refused in one line."""

from __future__ import annotations

import pytest

from paramscope.cli import main
from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.cost.traced.parallel import check_layout, with_mixed_precision
from paramscope.errors import OptionError

# test_fsdp_closed_form.py's Llama cut: Llama-3's proportions at hidden size 128
CUT = dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1, vocab_size=4008)


def test_policy_derived_equals_the_traced_rank_on_a_llama_cut():
    """dp 2, 2 × 64 tokens: the derived rank (its recipe traced with fully_shard's mp_policy and no autocast) equals
    the rank traced with the same policy (--trace) in every phase but the analytic optimizer step's, which is
    the same; the convention is named in the layout's words and in a note."""
    import transformers as T

    config = T.LlamaConfig(num_hidden_layers=4, architectures=["LlamaForCausalLM"], **CUT)
    layout = ParallelLayout(dp=2, shard="fsdp", fsdp_mixed_precision="policy")
    _, estimate, _ = training_answer(config, TrainingOptions(batch=2, seq=64, precision="bf16-mixed", fits=False,
                                                             trace=True, layout=layout), use_cache=False)
    device = estimate.training.device
    assert device.activations_from.startswith("derived")
    derived = {p.phase: p.bytes for p in device.phases}
    traced = {p.phase: p.bytes for p in device.traced.phases}
    assert derived == traced == {"forward": 22_249_780, "backward": 23_273_764, "optimizer step": 15_033_628}
    assert layout.words() == "dp 2 (FSDP2, its MixedPrecisionPolicy) = 2 devices"
    assert any(n.startswith("mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), "
                            "torchtitan's") for n in device.notes)
    assert any("MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's: the fp32 shards gathered"
               in n for n in device.traced.notes)
    # the policy's closed form beside (fsdp_moments.py; tests/test_fsdp_policy_closed_form.py holds it equal)
    assert "check: the closed form gives 23,273,764 B, +0.000% from the derived peak" in device.notes


def test_the_policy_keys_the_traced_layout_and_autocast_keeps_the_old_keys():
    assert with_mixed_precision((2, "fsdp", 1, False), "autocast") == (2, "fsdp", 1, False)
    assert with_mixed_precision((2, "fsdp", 1, False), "policy") == (2, "fsdp", 1, False, 0, 1, 1, 1, "policy")
    assert with_mixed_precision((4, "fsdp", 1, False, 0, 2), "policy") == (4, "fsdp", 1, False, 0, 2, 1, 1, "policy")
    assert check_layout(2, "fsdp", 1, False, 0, 1, 1, 1, "policy").mixed == "policy"


@pytest.mark.parametrize("kwargs, words", [
    (dict(devices=8, zero="3"), "needs zero fsdp or hybrid_shard, got ZeRO-3"),
    (dict(devices=8, zero="0", tp=2), "needs zero fsdp or hybrid_shard, got no sharding"),
])
def test_the_policy_is_refused_where_it_does_not_apply(kwargs, words):
    with pytest.raises(OptionError, match=words):
        layout_for(fsdp_mixed_precision="policy", **kwargs)
    with pytest.raises(OptionError, match="must be one of autocast, policy"):
        layout_for(devices=8, zero="fsdp", fsdp_mixed_precision="amp")
    with pytest.raises(OptionError, match="it needs shard 'fsdp'"):
        check_layout(2, "none", 1, False, 0, 1, 1, 1, "policy")


def test_the_cli_refuses_the_policy_without_a_mixed_precision_in_one_line(capsys):
    argv = ["memory", "llama-3-8b", "--training", "--devices", "8", "--zero", "fsdp", "--precision", "fp32",
            "--fsdp-mixed-precision", "policy"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a mixed precision (bf16-mixed, fp16-mixed), got fp32" in err
    assert main(["memory", "llama-3-8b", "--fsdp-mixed-precision", "policy"]) != 0
    assert "--fsdp-mixed-precision is for --training" in capsys.readouterr().err
