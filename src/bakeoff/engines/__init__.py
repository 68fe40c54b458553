"""Engine plugins. Importing this package registers the built-in engines."""

from bakeoff.engines import llamacpp, llamacpppy, vllm  # noqa: F401  (registration side effect)
from bakeoff.engines.base import ENGINES, Engine, ServerSpec, get_engine, register

__all__ = ["ENGINES", "Engine", "ServerSpec", "get_engine", "register"]
