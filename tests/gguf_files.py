"""Writing small GGUF files in tests: the tensors added at their ggml types (Q8_0 and Q4_0 quantised by gguf's own
quantiser, F16 cast, anything else F32) and the file closed, as GGUFWriter wants it done."""

from __future__ import annotations

from typing import Any, Callable

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def add_tensors_and_close(writer: Any, tensors: dict[str, tuple[tuple[int, ...], Any]],
                          values: Callable[[tuple[int, ...]], Any]) -> None:
    """Add each name → (PyTorch shape, ggml type), its values from `values(shape)` (float32), then write and close."""
    for name, (shape, qtype) in tensors.items():
        data = values(shape)
        if qtype in (Q.Q8_0, Q.Q4_0):
            packed = gguf.quants.quantize(data, qtype)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)
        elif qtype == Q.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
