"""``custom_dataset`` hooks for the offline lm-eval tasks (see bakeoff.quality.localdata)."""

from __future__ import annotations

from typing import Any


def ppl_dataset(**_: Any) -> Any:
    import datasets

    from bakeoff.quality.localdata import documents

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(documents())})


def mc_dataset(**_: Any) -> Any:
    import datasets

    from bakeoff.quality.localdata import mc_items

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(mc_items())})
