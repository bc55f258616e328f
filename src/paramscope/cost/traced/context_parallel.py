"""Context parallelism for the traced engine: torch's own ring attention (torch.distributed.tensor.experimental's
context parallel: _templated_ring_attention and its backward) on one rank of the fake process group, with the CPU
flash kernel as its per-block attention, called where every buffer it makes is seen.

Why not torch's context_parallel() as it stands. It patches F.scaled_dot_product_attention so that q, k and v become
Shard(2) DTensors on the cp mesh, and DTensor's dispatcher sends the SDPA kernels they reach to its ring: only the
CUDA ones (_scaled_dot_product_flash/efficient/cudnn_attention and their backwards: its _sdpa_handler and Shard(2)
sharding rules). The traced engine runs on CPU fake tensors (fake CUDA tensors do not work in a CPU build: SDPA falls
to its math kernel and autograd aborts the process), where SDPA reaches _scaled_dot_product_flash_attention_for_cpu,
and torch 2.13 stops: "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered". Adding that kernel to its handlers runs, but the ring then runs inside DTensor's
__torch_dispatch__, below every dispatch mode: MemTracker and the timeline see the op's two outputs and none of the
ring's own buffers (the all-gathered K and V, the fp32 merge, the backward's fp32 gradient accumulators).

So here the same functions run one level up: F.scaled_dot_product_attention is replaced, as context_parallel
replaces it, by an autograd function whose forward calls torch's _templated_ring_attention and whose backward calls
_templated_ring_attention_backward, on the rank's local q, k and v, with the CPU flash kernel and its backward as the
op, exactly as torch's flash handler calls them with the CUDA kernel: the same rotation (K and V all-gathered, by
torch's default rotate method; their gradients all-to-all), the same head-tail load balancing (on where 2·cp divides
S, as context_parallel decides), the same fp32 merge of the blocks' outputs and log-sum-exps. The autograd node saves
what the kernel's own node saves (q, k, v, the output, the log-sum-exp). The CPU flash kernel is the one-device
trace's stand-in for flash attention already (step.py): its output and fp32 log-sum-exp have flash's shapes, and it
takes fewer KV heads than query heads as they come (GQA).

The rank runs its S / cp tokens (the shard context_parallel leaves of the batch's ids and labels); transformers
numbers them 0..S/cp-1 (no position ids are fed), which changes no shape. Beside tensor parallelism (parallel.py's
(dp, cp, tp) mesh, as torchtitan composes them) the attention reaches F.scaled_dot_product_attention with the heads
its tp rank holds, as plain local tensors (parallelize_module's outputs), so the ring runs on those heads over the cp
group alone; FSDP2 has gathered the weights by then, so nothing of it reaches the ring. A mask (padding, an encoder's bidirectional
attention), attention dropout and a non-causal call are refused: torch's ring takes no attn_bias, and its load
balancing needs is_causal.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from ...errors import UnsupportedError


@contextmanager
def ring_attention(mesh: Any, seq: int) -> Iterator[str]:
    """F.scaled_dot_product_attention replaced by torch's ring over `mesh`'s group for a sequence of `seq` tokens
    (the load balancing context_parallel would choose for it); yields a note naming what runs."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import _attention
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _create_default_load_balancer

    options = _attention._cp_options
    before = options.enable_load_balance
    options.enable_load_balance = _create_default_load_balancer(seq, mesh.size(), "cpu") is not None
    balanced = options.enable_load_balance
    original = F.scaled_dot_product_attention
    group = mesh.get_group()
    calls = []

    def ring_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        _check(attn_mask, dropout_p, is_causal)
        if value.shape[-1] != query.shape[-1]:
            raise UnsupportedError(f"context parallel attention whose values' head size ({value.shape[-1]}) is not "
                                   f"its queries' ({query.shape[-1]}; MLA's): the flash kernel the ring's blocks run "
                                   "takes them equal")
        calls.append(1)
        query, key, value = _autocast(query, key, value)
        return _ring().apply(query, key, value, group, scale)

    F.scaled_dot_product_attention = ring_sdpa
    try:
        rotate = options.rotate_method.name.lower().replace("_", "-")
        yield (f"context parallel {mesh.size()}: torch's ring attention (its _templated_ring_attention and backward: "
               f"K and V {rotate} over the cp ranks, their gradients all-to-all, blocks merged in fp32"
               + (", head-tail load balancing" if balanced else ", no load balancing (2·cp does not divide S)")
               + "), the CPU flash kernel as its per-block attention; the rank runs its S / cp tokens")
        if not calls:  # eager attention, or another kernel: the rank would attend to its own tokens alone
            raise UnsupportedError("context parallel: the step never called F.scaled_dot_product_attention (eager or "
                                   "another attention), so torch's ring did not run; the sdpa attention runs it")
    finally:
        F.scaled_dot_product_attention = original
        options.enable_load_balance = before


def _autocast(*tensors: Any) -> tuple[Any, ...]:
    """q, k and v as autocast hands them to the attention kernel: under torch.autocast, context_parallel's patched
    F.scaled_dot_product_attention reaches aten's SDPA, whose autocast rule (a lower-precision op) casts its
    floating-point arguments to the autocast dtype before DTensor's dispatch runs the ring; the autograd function
    here sits above that rule, so it casts them itself (Llama's rotary output is fp32 where its cos/sin are)."""
    import torch

    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t for t in tensors)


def _check(attn_mask: Any, dropout_p: float, is_causal: bool) -> None:
    if attn_mask is not None:
        raise UnsupportedError("context parallel attention with a mask (padding, bidirectional): torch's ring "
                               "attention takes none")
    if dropout_p:
        raise UnsupportedError("context parallel attention with dropout is not traced")
    if not is_causal:
        raise UnsupportedError("context parallel attention that is not causal: torch's ring balances the load only "
                               "under is_causal")


def _ring() -> Any:
    """The autograd function: torch's ring forward and backward with the CPU flash kernel."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention, _templated_ring_attention_backward)

    aten = torch.ops.aten

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any, group: Any, scale: Any) -> Any:
            out, lse = _templated_ring_attention(group, 2, aten._scaled_dot_product_flash_attention_for_cpu.default,
                                                 query, key, value, is_causal=True, dropout_p=0.0, scale=scale)
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.group, ctx.scale = group, scale
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            query, key, value, out, lse = ctx.saved_tensors
            grads = _templated_ring_attention_backward(
                ctx.group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out=grad_out,
                grad_out_name="grad_out", query=query, key=key, value=value, out=out, logsumexp=lse, is_causal=True,
                dropout_p=0.0, scale=ctx.scale)
            return grads[0], grads[1], grads[2], None, None

    return RingAttention
