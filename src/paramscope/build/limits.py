"""The bounds a config and its build are held to (README, "Limits and safety"): layers, modules, tensor dimensions,
labels, and the layers the cost commands build."""

# Bounds, documented in the README ("Limits"): each lies far above every real model and far below what would
# cost minutes or gigabytes to build on meta (about 0.3 ms and a few KB per module).
MAX_LAYERS = 1024  # the deepest published transformer (DeepNet) has 1,000 layers
MAX_MODULES = 15_000  # Llama-3.1-405B builds 1,645 modules, DeepSeek-V3 1,215; 15,000 take about 4 s
MAX_DIMENSION = 2**31 - 1  # no tensor dimension is larger; products of three stay inside int64
MAX_LABELS = 100_000  # transformers builds an id2label entry per label: 1,000,000 cost 12 s and 650 MB
# `memory` and `flops` run more than a build per layer (a prefill on meta to check the KV cache, traces, analytic
# sums): about 25-30 ms a layer on a 2-core machine, so a 1,024-layer build took 22-36 s there. They build at most
# this many, within 30 s; inspect, compare and diff build up to MAX_LAYERS.
MAX_COST_LAYERS = 512
