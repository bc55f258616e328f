"""The bytes of a model's weights in a storage format: by dtype, by role and by component, with the arithmetic.

`weight_memory` is pure: it takes the counted tensors (their dtypes as transformers builds them in the compute
dtype), the names the format quantises and the names transformers keeps in fp32, and adds up bytes. Which names
those are is decided by `quantized_names` from the model's view (model_view.py: the built module, or facts
recorded from it), as transformers' quantisers and loader decide them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...count import BufferInfo, ParameterInfo
from ...frozen import FrozenDict, freeze_fields
from ..dtypes import itemsize, short_name
from .quantization import WeightFormat, partial_group_notes

# Roles every format keeps in higher precision: routers decide which experts run, and llama.cpp, bitsandbytes
# and the fp8 checkpoints all leave them unquantised.
_KEPT_ROLES = ("moe.router",)


@dataclass(frozen=True)
class WeightMemory:
    bytes: int  # the parameters as stored, quantisation overhead included (buffers are apart)
    buffer_bytes: int  # buffers (rotary frequencies, position ids): loaded with the model, not weights
    overhead: int  # scales, zero points, absmax, maps: included in `bytes`
    by_dtype: FrozenDict[str, int]  # storage ("bf16", "nf4", "fp32") → bytes of parameters
    buffers_by_dtype: FrozenDict[str, int]
    by_role: FrozenDict[str, int]  # role → bytes of its parameters
    by_component: FrozenDict[str, int]  # top-level component → bytes of its parameters
    format: WeightFormat
    quantized: int  # parameters stored quantised
    quantized_tensors: tuple[str, ...]  # their names
    kept: tuple[tuple[str, int, str], ...]  # (what, parameters, storage) left out of the quantisation
    lines: tuple[tuple[str, int, str], ...]  # (label, bytes, arithmetic): how the total adds up
    notes: tuple[str, ...] = ()  # what the format's arithmetic decided, in words (a GPTQ group's partial last group)

    def __post_init__(self) -> None:
        freeze_fields(self, "by_dtype", "buffers_by_dtype", "by_role", "by_component")


def weight_memory(params: Iterable[ParameterInfo], buffers: Iterable[BufferInfo], fmt: WeightFormat, *,
                  quantized: frozenset[str] = frozenset(), fp32: frozenset[str] = frozenset(),
                  components: Iterable[str] = (), inputs_first: frozenset[str] = frozenset()) -> WeightMemory:
    """Bytes of `params` and `buffers` stored as `fmt`.

    `quantized` names the parameters the format quantises; the rest keep the dtype they were built in (the
    compute dtype), except `fp32`, the parameters transformers keeps in float32 (`_keep_in_fp32_modules`).
    `inputs_first` names the weights stored [in, out] (GPT-2's Conv1D, `input_first_weights`): the quantisers
    read their input from the first dimension, so their groups and rows are counted on the shape turned round.
    """
    params, buffers = tuple(params), tuple(buffers)
    component_names = sorted((c for c in components if c), key=len, reverse=True)
    by_dtype: dict[str, int] = {}
    by_role: dict[str, int] = {}
    by_component: dict[str, int] = {}
    kept: dict[tuple[str, str], int] = {}
    overhead = quantized_numel = 0
    groups: dict[str, list[int]] = {}  # storage → [numel, data bytes, overhead bytes]
    stored = getattr(fmt, "stored_bytes", None)  # a file's own bytes per parameter (checkpoint/gguf_memory.py)
    named = getattr(fmt, "named_bytes", None)
    for param in params:
        if stored is not None:  # the file's types, tensor by tensor: its floats are no choice the format made
            cost = stored(param)
            quantized_numel += param.numel if param.name in quantized else 0
        elif param.name in quantized:
            # compressed-tensors: each weight in its own config group's scheme (memory/compressed_tensors.py)
            cost = named(param.name, _input_last(param, inputs_first)) if named else \
                fmt.tensor_bytes(_input_last(param, inputs_first))
            quantized_numel += param.numel
            overhead += cost.overhead
        else:
            dtype = "float32" if param.name in fp32 else param.dtype
            cost = fmt.plain_bytes(param.numel, dtype)
            if fmt.quantized:
                why = "kept in fp32 by transformers" if param.name in fp32 else _why_kept(param)
                kept[(why, cost.storage)] = kept.get((why, cost.storage), 0) + param.numel
        by_dtype[cost.storage] = by_dtype.get(cost.storage, 0) + cost.total
        by_role[param.role] = by_role.get(param.role, 0) + cost.total
        owner = next((c for c in component_names if param.name == c or param.name.startswith(c + ".")), "(root)")
        by_component[owner] = by_component.get(owner, 0) + cost.total
        group = groups.setdefault(cost.storage, [0, 0, 0])
        group[0] += param.numel
        group[1] += cost.data
        group[2] += cost.overhead
    parameter_bytes = sum(by_dtype.values())
    buffer_bytes = 0
    buffers_by_dtype: dict[str, int] = {}
    for buffer in buffers:
        dtype = "float32" if buffer.name in fp32 and buffer.dtype in ("bfloat16", "float16") else buffer.dtype
        size = itemsize(dtype)
        buffer_bytes += buffer.numel * size
        storage = short_name(dtype)
        buffers_by_dtype[storage] = buffers_by_dtype.get(storage, 0) + buffer.numel * size
    lines = []
    for storage, (numel, data, extra) in groups.items():
        if extra:
            text = f"{numel:,} parameters: {data:,} B of values + {extra:,} B of scales and metadata"
        else:
            size = data // numel if numel else 0
            text = f"{numel:,} parameters × {size} B" if numel and data == numel * size else f"{numel:,} parameters"
        lines.append((f"parameters in {storage}", data + extra, text))
    return WeightMemory(
        bytes=parameter_bytes,
        buffer_bytes=buffer_bytes,
        overhead=overhead,
        by_dtype=dict(sorted(by_dtype.items(), key=lambda kv: -kv[1])),
        buffers_by_dtype=buffers_by_dtype,
        by_role=by_role,
        by_component=by_component,
        format=fmt,
        quantized=quantized_numel,
        quantized_tensors=tuple(p.name for p in params if p.name in quantized),
        kept=tuple((why, numel, storage) for (why, storage), numel in kept.items()),
        lines=tuple(lines),
        notes=() if stored is not None else partial_group_notes(fmt, ((p.role, _input_last(p, inputs_first))
                                                                      for p in params if p.name in quantized)),
    )


def _input_last(param: ParameterInfo, inputs_first: frozenset[str]) -> tuple[int, ...]:
    """The parameter's shape as the quantisers read it, the input dimension last (nn.Linear's [out, in])."""
    shape = tuple(param.shape)
    return shape[::-1] if param.name in inputs_first and len(shape) == 2 else shape


def input_first_weights(view: Any, names: Iterable[str]) -> frozenset[str]:
    """Of the weight names `names`, those of transformers' Conv1D (GPT-2's attention and MLP), stored [in, out].
    transformers' GPTQ and bitsandbytes integrations build their layers with in_features = weight.shape[0] for
    these, so a group runs along the first dimension and a per-row scale is one per output (the second)."""
    names = frozenset(names)
    if not names:
        return frozenset()
    found = set()
    for path, sub in view.root.named_modules():
        weight = f"{path}.weight" if path else "weight"
        if weight in names and type(sub).__name__ == "Conv1D":
            found.add(weight)
    return frozenset(found)


def _why_kept(param: ParameterInfo) -> str:
    role = param.role
    if role.startswith("embeddings.") or role in ("head.lm", "head.decoder"):
        return "embeddings and output head"
    if len(param.shape) < 2:
        return "norms, biases and other 1-D tensors"
    if role in _KEPT_ROLES:
        return "routers"
    if _in_experts(param.name) and param.name.endswith("bias"):
        return "the experts' biases"
    if _in_experts(param.name):
        return "fused experts (3-D tensors, not nn.Linear: transformers' integration of this format skips them)"
    return "other tensors the format does not quantise"


# --- reading the real module: which tensors a format quantises ----------------------------------------------------

def quantized_names(view: Any, params: Iterable[ParameterInfo], fmt: WeightFormat,
                    not_convert: Iterable[str] = ()) -> frozenset[str]:
    """The canonical parameter names `fmt` stores quantised, decided as the libraries decide; `view` is the
    model's ModelView (model_view.py).

    - "linear" (bitsandbytes, GPTQ, AWQ, fp8): the weight of every module whose type is exactly nn.Linear or
      transformers' Conv1D, as transformers' quantisers replace them, except its default skips (tied
      weights, the output embeddings and the last module: `get_keys_to_not_convert`) and the config's
      `modules_to_not_convert`. Fused expert tensors (3-D parameters) are not nn.Linear and stay unquantised.
    - "matrices" (GGUF): every tensor of two or more dimensions except routers.
    - "linear+experts" (fp8): the same, and the fused expert tensors of every `….experts` module, which
      transformers' fine-grained fp8 replaces with FP8Experts.
    - "experts" (MXFP4): the fused expert matrices; their biases (gpt-oss's `gate_up_proj_bias`, `down_proj_bias`)
      stay in the compute dtype, as the checkpoint stores them and `Mxfp4HfQuantizer.param_needs_quantization`
      leaves them.
    """
    if not fmt.quantized:
        return frozenset()
    params = tuple(params)
    if hasattr(fmt, "quantized_names"):  # a file's own types say it (checkpoint/gguf_memory.py)
        return fmt.quantized_names(params)
    skip = _matcher(tuple(not_convert))
    if fmt.targets == "matrices":
        return frozenset(p.name for p in params if len(p.shape) >= 2 and p.role not in _KEPT_ROLES)
    experts = frozenset(p.name for p in params if len(p.shape) >= 2 and _in_experts(p.name)
                        and not skip(p.name.rpartition(".")[0]))
    if fmt.targets == "experts":  # MXFP4: transformers' quantiser keeps the experts' biases unquantised
        return frozenset(name for name in experts if not name.rpartition(".")[2].endswith("bias"))
    if hasattr(fmt, "select"):  # compressed-tensors: the config's targets and ignore list, no default skips
        return fmt.select(params, view.linear_modules())
    canonical = {p.name for p in params}
    default_skips = view.default_skips
    names = set()
    for module_name in view.linear_modules():
        weight_name = f"{module_name}.weight" if module_name else "weight"
        if weight_name not in canonical or skip(module_name) or _skipped_by(module_name, default_skips):
            continue
        names.add(weight_name)
    if fmt.targets == "linear+experts":
        names |= experts
    return frozenset(names)


def _in_experts(name: str) -> bool:
    """A fused expert tensor: a parameter of a module named `experts` (`….mlp.experts.gate_up_proj`)."""
    module = name.rpartition(".")[0]
    return module == "experts" or module.endswith(".experts")


def _skipped_by(module_name: str, skips: tuple[str, ...]) -> bool:
    return any(module_name == s or module_name.startswith(s + ".") or module_name.endswith("." + s)
               for s in skips)


def _matcher(patterns: tuple[str, ...]):
    """transformers' `should_convert_module`, negated, with the config's patterns read as globs.

    A pattern matches a module from the start up to a module boundary, or as a suffix; `*` matches anything.
    transformers compiles the patterns as regular expressions; a config is untrusted input, so here only `*` is
    special (no backtracking blow-up from a hostile pattern).
    """
    compiled = []
    for pattern in patterns[:1000]:
        if not isinstance(pattern, str) or len(pattern) > 500:
            continue
        body = ".*".join(re.escape(part) for part in pattern.replace(".*", "*").split("*"))
        compiled.append((pattern, re.compile(rf"(?:{body})(?:(?<=\.)|(?=\.|$))")))

    def skip(module_name: str) -> bool:
        return any(regex.match(module_name) or module_name.endswith(pattern) for pattern, regex in compiled)

    return skip
