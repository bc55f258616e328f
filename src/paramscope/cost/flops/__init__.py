"""FLOPs, analytic: a forward pass or a training step by role, and the pipeline that checks it against a trace."""
