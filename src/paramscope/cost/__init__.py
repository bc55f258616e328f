"""What parameters cost: memory now (to load, to serve with a KV cache; training's model states), FLOPs next.

    storage format (quantization.py, dtypes.py) → weights.py ─┐
    config → kv_cache.py (checked against probe.py)  ─────────┼→ memory.py (MemoryEstimate, fits) ← hardware.py
    the prefill's workspace (memory.py) ───────────────────────┘
    estimate.py: build on meta in the compute dtype, then add it all up
    training.py: weights, gradients, optimizer states, master weights, ZeRO shards

The pure modules (dtypes, quantization, kv_cache, memory, hardware, training) use the standard library alone;
weights.py, probe.py and estimate.py look at the built module.
"""
