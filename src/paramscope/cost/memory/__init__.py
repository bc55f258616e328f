"""Memory, analytic: the bytes of weights, KV cache, workspace, model states and activations, and the pipelines."""
