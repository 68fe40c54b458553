"""bakeoff: experiment-as-code for comparing LLM serving stacks.

Engines x quantization formats x load, with one client and one set of metric
definitions for every engine. The Snakefile owns the DAG; this package holds
the logic each DAG stage runs.
"""

__version__ = "0.1.0"
