"""What parameters cost: memory to load, to serve with a KV cache and to train; FLOPs next.

    storage format (quantization.py, dtypes.py) → weights.py ─┐
    config → kv_cache.py (checked against probe.py)  ─────────┼→ memory.py (MemoryEstimate, fits) ← hardware.py
    the prefill's workspace (memory.py) ───────────────────────┘
    estimate.py: serving — build on meta in the compute dtype, then add it all up

    training.py (weights, gradients, optimizer states, master weights, ZeRO shards) ─┐
    activations.py (closed forms per family: saved bytes and the step's moments) ────┼→ training_estimate.py
    trace.py (one real step on fake tensors, measured by torch's MemTracker) ────────┘

trace.py is the traced engine both modes share (a training step; generate()'s prefill and decode steps): it
checks the analytic figures, answers for classes without a recipe, and is what FLOPs will count on.

The pure modules (dtypes, quantization, kv_cache, memory, hardware, training, activations) use the standard
library alone; weights.py, probe.py, trace.py, estimate.py and training_estimate.py look at the built module.
"""
