"""Element types by the names users type, their sizes in bytes, and sizes of memory ("24GiB", "80GB").

Standard library only: the analytic engine must answer without importing torch.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ..errors import OptionError

# The user's name → torch's name. The CLI takes the short names; configs declare torch's.
DTYPE_NAMES = {
    "fp32": "float32", "float32": "float32", "float": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp64": "float64", "float64": "float64", "double": "float64",
    "fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "int8": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool",
}

ITEMSIZE = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16,
}

SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "float8_e4m3fn": "fp8",
         "float8_e5m2": "fp8_e5m2"}

# The element types a KV cache or a model's unquantised tensors can be held in.
FLOAT_DTYPES = ("fp32", "bf16", "fp16", "fp8")


def torch_name(name: str) -> str:
    """`bf16` → `bfloat16`; raises naming the value when it is no known element type."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise OptionError(f"unknown dtype {name!r}; use one of {', '.join(FLOAT_DTYPES)}")
    return DTYPE_NAMES[key]


def itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype name ("bfloat16" → 2)."""
    dtype = dtype.removeprefix("torch.")
    if dtype not in ITEMSIZE:
        raise OptionError(f"no known size for dtype {dtype!r}")
    return ITEMSIZE[dtype]


def short_name(dtype: str) -> str:
    return SHORT.get(dtype.removeprefix("torch."), dtype.removeprefix("torch."))


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'24GiB' → 25,769,803,776; '80GB' → 80,000,000,000; a bare number is bytes. GB is decimal, GiB binary."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or len(str(text)) > 40:
        raise OptionError(f"not a memory size: {str(text)[:40]!r} (examples: 24GiB, 80GB, 512MiB)")
    value = int(Fraction(match.group(1)) * _UNITS[unit])  # exact: '1.5GiB' is 1,610,612,736
    if value <= 0:
        raise OptionError(f"a memory size must be positive, got {text!r}")
    return value
