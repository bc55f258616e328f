"""The mixed precision a training step takes where none is asked: what the frameworks run by default, named.

- One device, DDP (`--zero 0`), FSDP1's `no_shard` and `shard_grad_op` (DDP's and ZeRO-2's flat shares here):
  `bf16-mixed`, torch.autocast over fp32 weights (HF Trainer's `--bf16`, Lightning's "bf16-mixed"). FSDP1's
  `full_shard` is FSDP2's layout here (`--devices N --zero full_shard`), so it takes FSDP2's policy below.
- DeepSpeed's ZeRO 1-3 (`--zero 1/2/3`): `bf16-master`, DeepSpeed's bf16 (its engine casts the module to bf16 and
  keeps fp32 master weights and moments in its optimizer: what HF Trainer's `--bf16 --deepspeed` runs), where the
  optimizer is one the master copy runs (MASTER_OPTIMIZERS); bf16-mixed otherwise.
- FSDP2 (`--zero fsdp`, `hybrid_shard`) in a mixed precision: its MixedPrecisionPolicy(param_dtype=16-bit,
  reduce_dtype=fp32) with no autocast, as torchtitan's apply_fsdp runs it (accelerate's FSDP2 path enters no
  autocast either, its policy reducing in bf16): `--fsdp-mixed-precision policy`.

An asked precision is always taken as asked: `--precision bf16-mixed` under ZeRO is torch.autocast over fp32 weights
ZeRO shards, `--fsdp-mixed-precision autocast` under FSDP2 is autocast over the fp32 parameters FSDP2 gathers.
"""

from __future__ import annotations

from .states import MASTER_OPTIMIZERS, MASTER_PRECISION

AUTOCAST_PRECISION = "bf16-mixed"
# the --zero spellings that name DeepSpeed's ZeRO stages (FSDP1's shard_grad_op / full_shard are torch's, not these)
DEEPSPEED_ZERO = ("1", "2", "3", "zero1", "zero2", "zero3", "zero-1", "zero-2", "zero-3")


def default_precision(zero: str | int | None, optimizer: str) -> str:
    """bf16-master under DeepSpeed's ZeRO 1-3 with an optimizer the master copy runs; bf16-mixed otherwise."""
    deepspeed = str(zero if zero is not None else "0").strip().lower() in DEEPSPEED_ZERO
    return MASTER_PRECISION if deepspeed and str(optimizer).strip().lower() in MASTER_OPTIMIZERS \
        else AUTOCAST_PRECISION


def default_fsdp_mixed_precision(shard: str, precision: str) -> str:
    """FSDP2's MixedPrecisionPolicy ("policy") where FSDP2 shards (shard "fsdp" or "hsdp") in a mixed precision;
    "autocast" (no policy to apply) elsewhere."""
    return "policy" if shard in ("fsdp", "hsdp") and str(precision).endswith("-mixed") else "autocast"


def default_precision_words(precision: str) -> str:
    """The note a defaulted bf16-master answer carries: whose default it is, and how to ask autocast instead."""
    return (f"precision: {precision}, the default under DeepSpeed's ZeRO 1-3 (DeepSpeed's bf16, as HF Trainer's "
            "--bf16 with a DeepSpeed config runs it); --precision bf16-mixed for torch.autocast over the fp32 weights "
            "ZeRO shards")
