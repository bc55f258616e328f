"""Renderers: pure functions of a Report (and, for text, a width). They never count anything."""
