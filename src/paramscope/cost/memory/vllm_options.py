"""vLLM's settings as `vllm serve` spells them: `VllmOptions` and its checks, the release whose defaults are
followed (`VLLM_DEFAULTS_FROM`), the batch defaults for a GPU, the `--dtype` and `--kv-cache-dtype` flags, and the
`vllm serve` line that says a pre-flight's settings (vllm.py computes the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError
from ..dtypes import torch_name
from ..hardware import GiB
from .result import DEFAULT_RESERVE, check_memory_target

# the vLLM release whose defaults the pre-flight follows (named in the output and docs/commands.md); the budget
# arithmetic is the source read at the commits docs/commands.md names
VLLM_DEFAULTS_FROM = ("vLLM v0.27.1's defaults: --gpu-memory-utilization 0.92 (CacheConfig, as vLLM's serve "
                      "reference gives it; 0.9 in earlier releases), the CUDA graphs' memory subtracted from the KV "
                      "budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, \"default since v0.21.0\" as v0.27.1 logs "
                      "it); the budget arithmetic as read at vllm-project/vllm 35d5cda1")
DEFAULT_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM's CacheConfig.block_size choices (CUDA)
# vLLM's `vllm serve` defaults (EngineArgs.get_batch_defaults, OPENAI_API_SERVER): a GPU of 70 GiB or more that is
# not an A100 gets the larger batch; its threshold compares the memory CUDA reports
_LARGE_GPU = 70 * GiB
_SERVE_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}  # large GPU → (max_num_batched_tokens, max_num_seqs)
_MAX_TOKENS = 1 << 24
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_KV_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")  # the cache dtypes vLLM's flag names


@dataclass(frozen=True)
class VllmOptions:
    """`--engine vllm`'s settings, each as `vllm serve` spells it (None: vLLM's default for the GPU and model)."""

    gpu_memory_utilization: float = DEFAULT_UTILIZATION
    max_model_len: int | None = None  # None: the model's max_position_embeddings (vLLM's derived length)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    pp_layer_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION: stages' layers (None: vLLM's rule)
    # beside vLLM's flags, what paramscope reads (vllm_answer.py): the weights' storage, the KV cache's dtype, the
    # parallel degrees, and the GPU (or budget) whose memory vLLM's utilization multiplies
    dtype: str | None = None  # a storage format (--dtype); None: the checkpoint's declared one
    kv_dtype: str | None = None  # vLLM's --kv-cache-dtype; None: auto (the model's dtype)
    group_size: int | None = None  # GPTQ/AWQ
    tp: int = 1  # --tensor-parallel-size: each figure is one GPU's
    pp: int = 1  # --pipeline-parallel-size
    gpu: str | None = None
    budget: int | None = None  # bytes
    reserve: int = DEFAULT_RESERVE  # the CUDA context, outside vLLM's budget

    def check(self) -> None:
        check_memory_target(self.gpu, self.budget, self.reserve)
        if self.kv_dtype is not None and torch_name(self.kv_dtype) not in _KV_DTYPES:
            raise OptionError("{0} {value}: vLLM's {flag} takes auto (the model's dtype), bfloat16, fp8 or fp8_e5m2",
                              "kv_dtype", value=self.kv_dtype, flag="--kv-cache-dtype")  # vLLM's flag, not ours
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1 or math.isnan(u):
            raise OptionError("{0} must be a fraction in (0, 1], got {value}", "gpu_memory_utilization", value=u)
        if self.block_size not in BLOCK_SIZES:
            raise OptionError("{0} must be one of {choices} (vLLM's choices), got {value}", "block_size",
                              choices=", ".join(map(str, BLOCK_SIZES)), value=self.block_size)
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= _MAX_TOKENS:
                raise OptionError("{0} must be between 1 and {limit:,}, got {value}", name, limit=_MAX_TOKENS,
                                  value=value)
        if self.max_num_seqs is not None and self.max_num_batched_tokens is not None and \
                self.max_num_seqs > self.max_num_batched_tokens:
            raise OptionError("{0} ({seqs:,}) must not exceed {1} ({tokens:,}), as vLLM requires", "max_num_seqs",
                              "max_num_batched_tokens", seqs=self.max_num_seqs, tokens=self.max_num_batched_tokens)
        if self.pp_layer_partition is not None and (not self.pp_layer_partition or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.pp_layer_partition)):
            raise OptionError("{0} must be layer counts of one or more, one a stage, got {value}", "pp_layer_partition",
                              value=",".join(map(str, self.pp_layer_partition)))


def serve_defaults(total: int, gpu_name: str) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, where from) as `vllm serve` defaults them on this GPU."""
    large = total >= _LARGE_GPU and "a100" not in gpu_name.lower()
    tokens, seqs = _SERVE_DEFAULTS[large]
    why = ("70 GiB or more and not an A100" if large else
           ("an A100" if "a100" in gpu_name.lower() else "under 70 GiB"))
    return tokens, seqs, (f"vllm serve's defaults for a GPU of {why} (EngineArgs.get_batch_defaults, "
                          "OPENAI_API_SERVER)")


def vllm_dtype(config: dict[str, Any], dtype: str | None) -> tuple[str | None, str | None, str]:
    """(the --dtype the serving answer takes, the `vllm serve` flag that says it, a note): a float32 checkpoint
    without --dtype is served in bfloat16, as vLLM's `--dtype auto` resolves a float32 config to 16 bits
    (bfloat16 on GPUs that support it); a plain --dtype is vLLM's --dtype, fp8 its --quantization fp8; other
    formats are the checkpoint's own quantization_config to vLLM, with no flag."""
    from .declared import declared_format
    from .quantization import weight_format

    if dtype is None:
        if declared_format(config)[0].key == "fp32":
            return "bf16", "--dtype bfloat16", ("the config declares float32: vLLM's --dtype auto serves a float32 "
                                                "checkpoint in 16 bits (bfloat16 on GPUs that have it), and the "
                                                "weights are counted in bfloat16")
        return None, None, ""
    fmt = weight_format(dtype)
    if fmt.kind == "plain":
        return dtype, f"--dtype {_DTYPE_NAMES.get(fmt.key, fmt.key)}", ""
    if fmt.key == "fp8":
        return dtype, "--quantization fp8", ""
    return dtype, None, (f"--dtype {fmt.key}: vLLM reads a quantised checkpoint's own quantization_config, so the "
                         "command carries no flag for it")


def cache_dtype_flag(kv_dtype: str, compute_dtype: str | None) -> str | None:
    """`--kv-cache-dtype …` for a KV cache in `kv_dtype` (None: vLLM's auto, the model's dtype)."""
    if kv_dtype == compute_dtype:
        return None
    names = {"float8_e4m3fn": "fp8", "float8_e5m2": "fp8_e5m2", "bfloat16": "bfloat16"}
    if kv_dtype not in names:
        raise OptionError("{0} {value} is no KV cache dtype of vLLM's: it takes auto (the model's dtype, here "
                          "{model}), bfloat16, fp8 or fp8_e5m2", "kv_dtype", value=kv_dtype, model=compute_dtype)
    return f"--kv-cache-dtype {names[kv_dtype]}"


def serve_command(model_id: str, options: VllmOptions, tp: int, length: int, seqs: int, fits: bool, largest: int,
                  smallest: int | None, batched: int | None, kv_flag: str | None, dtype_flag: str | None,
                  model_max: int | None, pp: int = 1) -> tuple[str, str]:
    """The `vllm serve` line that fits (the asked settings where they fit; else the largest --max-model-len, or the
    smallest --tensor-parallel-size at the asked length), and what it changed."""
    use_tp, use_len, changes = tp, length, ""
    if not fits:
        wider = f"; or --tensor-parallel-size {smallest} at {length:,}" if smallest is not None else ""
        if largest > 0:
            use_len, changes = largest, f"--max-model-len {length:,} → {largest:,}, the largest that fits{wider}"
        elif smallest is not None:
            use_tp, changes = smallest, f"--tensor-parallel-size {tp} → {smallest} (at --max-model-len {length:,})"
        else:
            return "", "nothing fits: the weights and the reserve leave no KV cache at any tensor-parallel degree tried"
    parts = ([f"VLLM_PP_LAYER_PARTITION={','.join(map(str, options.pp_layer_partition))}"]
             if options.pp_layer_partition is not None and pp > 1 else []) + [f"vllm serve {model_id or 'MODEL'}"]
    if use_tp > 1:
        parts.append(f"--tensor-parallel-size {use_tp}")
    if pp > 1:
        parts.append(f"--pipeline-parallel-size {pp}")
    if dtype_flag:
        parts.append(dtype_flag)
    parts.append(f"--gpu-memory-utilization {options.gpu_memory_utilization:g}")
    if options.max_model_len is not None or use_len != model_max:
        parts.append(f"--max-model-len {use_len}")
    if kv_flag:
        parts.append(kv_flag)
    if options.block_size != DEFAULT_BLOCK_SIZE:
        parts.append(f"--block-size {options.block_size}")
    if options.max_num_seqs is not None:
        parts.append(f"--max-num-seqs {seqs}")
    if batched is not None:
        parts.append(f"--max-num-batched-tokens {batched}")
    return " ".join(parts), changes
