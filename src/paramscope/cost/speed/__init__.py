"""How fast a model serves: roofline bounds (roofline.py) for a model (answer.py)."""
