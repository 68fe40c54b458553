"""Composing an experiment's config: Hydra, the schema, then each engine's own checks; a sweep's points.

It sits above the engines, which it asks, and above the schema, which the engines read.
"""
