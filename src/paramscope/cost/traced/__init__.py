"""The traced engine: the real class run on fake tensors, measured by torch's MemTracker and FlopCounterMode."""
