"""Serving one variant: its job, its server's steps, each load cell's measurement, the capacity search."""
