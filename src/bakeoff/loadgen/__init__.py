"""bakeoff's load generator: one OpenAI-compatible streaming client for every engine.

It knows nothing about engines: it is given a base URL, a model name and a
tokenizer, and measures what comes back over ``/v1/completions``.
"""
