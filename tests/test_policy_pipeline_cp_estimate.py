"""FSDP2's MixedPrecisionPolicy (the default under --zero fsdp) beside a pipeline with context parallel: answered by
the Llama closed form over bf16-pure's stages on the cp rank's S / cp tokens, an estimate, and the output says why
(pipeline_device.POLICY_BESIDE_CP): the stages' derived replay keys the policy's FSDP2 rank without cp
(pipeline_replay.policy_rank_layout), and no stage is traced under FSDP2 beside the ring (trace_unsynced_fsdp runs
FSDP2 over dp alone), so there is nothing yet to hold it to."""

from __future__ import annotations

from paramscope.cli import main


def test_llama_3_8b_pp_cp_under_the_policy_is_the_named_estimate(capsys):
    """llama-3-8b --dp 2 --pp 2 --cp 2 --seq 8192 --batch 2 (1F1B, 2 microbatches of 1; the policy by default):
    stage 0's 1F1B steady state, 63,639,258,180 B a device."""
    argv = ["memory", "llama-3-8b", "--training", "--dp", "2", "--pp", "2", "--cp", "2", "--zero", "fsdp",
            "--seq", "8192", "--batch", "2", "--width", "400"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "peak per device (backward) 63,639,258,180" in out
    assert "gathered as bf16 by FSDP2's MixedPrecisionPolicy" in out
    assert "beside context parallel the derived replay reaches no cp rank under FSDP2's MixedPrecisionPolicy, so " \
           "memory answers with the closed form above too, an estimate" in out
