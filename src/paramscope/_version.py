"""paramscope's version: one module that imports nothing, so any module may read it without a circle."""

__version__ = "0.1.0"
