"""Cost facts: what the engines read of a build beyond its report, recorded per config and checked before use."""
