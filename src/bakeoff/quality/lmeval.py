"""Drive lm-eval's ``local-completions`` backend against a running server.

One evaluator for every variant: lm-eval tokenizes with the model's own
tokenizer (the fp16 checkpoint's), sends token-id prompts with ``echo`` and
reads prompt logprobs, exactly as it would for any OpenAI-compatible server.
bakeoff's offline tasks (``pydoc_ppl``, ``pydoc_mc``) live beside this file;
lm-eval's own tasks (wikitext, hellaswag, arc_easy, ...) are available by name,
with dataset revisions pinned from config.
"""

from __future__ import annotations

import logging
import math
from functools import cache
from pathlib import Path
from typing import Any

from bakeoff.errors import ConfigError

TASKS_DIR = Path(__file__).parent / "tasks"
# lm-eval result keys -> the summary's names
PPL_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
ACC_METRICS = ("acc", "acc_norm")


@cache
def task_manager() -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR))


def check_tasks(tasks: list[str]) -> None:
    """Fail before any server starts if a task name is unknown to lm-eval and to bakeoff."""
    known = set(task_manager().all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        local = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown eval task(s) {unknown}: not an lm-eval task nor one of bakeoff's local tasks "
                          f"{local} (eval.tasks)")


def _task_spec(name: str, revisions: dict[str, str]) -> str | dict[str, Any]:
    if name in revisions:
        return {"task": name, "dataset_kwargs": {"revision": revisions[name]}}
    return name


def evaluate(base_url: str, model: str, tokenizer_dir: Path, tasks: list[str], *, limit: int | None,
             max_length: int, num_concurrent: int, revisions: dict[str, str] | None = None,
             api_key: str | None = None) -> dict[str, dict[str, Any]]:
    """Run ``tasks``; returns ``{task: {metric: value, ..., "n": docs scored}}``."""
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's per-request progress bars would flood the rule's log
    import lm_eval

    check_tasks(tasks)
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    model_args: dict[str, Any] = {
        "base_url": f"{base_url}/v1/completions", "model": model, "tokenizer": str(tokenizer_dir),
        "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": num_concurrent,
        "max_retries": 1, "max_length": max_length, "timeout": 600,
    }
    if api_key:
        model_args["auth_token"] = api_key
    out = lm_eval.simple_evaluate(model="local-completions", model_args=model_args,
                                  tasks=[_task_spec(t, revisions or {}) for t in tasks], limit=limit,
                                  task_manager=task_manager(), log_samples=False, bootstrap_iters=0,
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    if out is None:
        raise RuntimeError("lm-eval returned no results")
    scores: dict[str, dict[str, Any]] = {}
    for task in tasks:
        res = out["results"].get(task, {})
        row: dict[str, Any] = {}
        for key, value in res.items():
            metric, _, filt = key.partition(",")
            if metric in PPL_METRICS + ACC_METRICS and isinstance(value, (int, float)):
                row[metric] = float(value)
        n = out.get("n-samples", {}).get(task, {})
        row["n"] = int(n.get("effective", 0))
        bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise RuntimeError(f"lm-eval task {task}: non-finite {bad}")
        scores[task] = row
    return scores
