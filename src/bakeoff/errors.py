"""Exception types with messages meant for the person running the pipeline.

Every error bakeoff raises on bad input names the thing that is wrong (the
config key, the file, the model) so the user can fix it without reading code.
"""


class BakeoffError(Exception):
    """Base class: a problem the user can fix; the CLI prints it without a traceback."""


class ConfigError(BakeoffError):
    """The composed configuration is invalid."""


class ManifestError(BakeoffError):
    """An artifact does not match its recorded manifest (missing file, wrong sha256)."""


class ModelSourceError(BakeoffError):
    """A model cannot be obtained (unknown model, offline without a cache, bad revision)."""


class ToolchainError(BakeoffError):
    """The pinned llama.cpp toolchain cannot be fetched, verified or built."""
