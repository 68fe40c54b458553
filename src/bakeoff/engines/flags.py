"""Engine settings -> command-line flags, one rule for every engine.

``{"max_model_len": 4096, "enforce_eager": True, "quantization": None}``
becomes ``--max-model-len 4096 --enforce-eager``: booleans are flags, None
means "engine default". Both vLLM and llama-server accept these long forms.
"""

from __future__ import annotations

from typing import Any


def settings_to_flags(settings: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    out: list[str] = []
    for key, value in settings.items():
        if key in skip or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        else:
            out += [flag, str(value)]
    return out
