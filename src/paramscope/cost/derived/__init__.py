"""The derived engine: a class's training-step memory as closed forms in batch and sequence length, derived from
a few traces of short cuts of the real class and checked against one more before use (derive.py → recipe.py)."""
