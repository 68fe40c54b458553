"""Score one variant's quality on an OpenAI-compatible server.

Called by the serve stage (through bakeoff.quality.plan), because the rule is one server per config:
vLLM variants are scored on the very server the load tests used; engines that
cannot score prompts (llama-server) name an ``eval_server`` that serves the same
artifact (llama-cpp-python for GGUF). Order: the logprob canary first (a server
that fails it gets no score, never a chance-level one), then lm-eval's tasks,
then the top-k logprobs of the KL reference text. Writes ``quality.json`` and
``topk.json`` into the variant's result directory.

Statuses, all results rather than crashes: ``ok``; ``unsupported`` (the
variant's server cannot start, or the route fails the canary); ``failed``
(the evaluation broke: lm-eval error, server died); ``skipped`` (synthetic
weights have no meaningful quality, or no tasks are configured).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EvalCfg
from bakeoff.layout import QUALITY_FILE, TOPK_FILE
from bakeoff.models.artifacts import atomic_write_text, read_kept, write_kept
from bakeoff.quality import canary, lmeval, localdata, topk


def eval_hash(eval_cfg: EvalCfg, route: dict[str, Any], artifact_sha: str | None) -> str:
    """What a score depends on: the eval config, the scoring route, the artifact, and the local text."""
    blob = json.dumps([eval_cfg.model_dump(mode="json"), route, artifact_sha, localdata.fingerprint()],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def reusable(out_dir: Path, digest: str) -> bool:
    """A kept score made with these inputs stands (a failure is tried again)."""
    prev = read_kept(out_dir / QUALITY_FILE)
    return prev is not None and prev.get("eval_hash") == digest and prev.get("status") in ("ok", "unsupported", "skipped")


def write(out_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    write_kept(out_dir / QUALITY_FILE, json.dumps(record, indent=2, default=str) + "\n")
    return record


def kl_reference_ids(tokenizer: Any, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` tokens of the local reference text (identical for every variant)."""
    text = "\n\n".join(d["text"] for d in localdata.documents())
    return tokenizer.encode(text, add_special_tokens=False)[:n_tokens]


def score(*, base_url: str, model: str, api_key: str | None, tokenizer: Any, tokenizer_dir: Path, eval_cfg: EvalCfg,
          max_length: int, out_dir: Path) -> dict[str, Any]:
    """Canary, tasks, top-k; returns the record's score fields (raises CanaryError / others)."""
    t0 = time.time()
    lmeval.check_tasks(eval_cfg.tasks)
    result: dict[str, Any] = {"canary": canary.check(base_url, model, tokenizer, api_key)}
    print(f"canary passed: {result['canary']}", file=sys.stderr, flush=True)
    tasks: dict[str, Any] = {}
    for task in eval_cfg.tasks:
        tasks.update(lmeval.evaluate(base_url, model, tokenizer_dir, [task], limit=eval_cfg.limit_for(task),
                                     max_length=max_length, num_concurrent=eval_cfg.num_concurrent,
                                     revisions=eval_cfg.revisions, api_key=api_key))
        print(f"{task}: {tasks[task]}", file=sys.stderr, flush=True)
    result["tasks"] = tasks
    result["local_text_sha256"] = localdata.fingerprint()
    result["dataset_revisions"] = eval_cfg.revisions
    if eval_cfg.kl_tokens:
        ids = kl_reference_ids(tokenizer, eval_cfg.kl_tokens)
        window = min(max_length - 1, 1024)
        lists = topk.score_topk(base_url, model, ids, window, top=eval_cfg.top_k, api_key=api_key)
        atomic_write_text(out_dir / TOPK_FILE, json.dumps({"top_k": eval_cfg.top_k, "window": window, "positions": lists}))
        result["kl_positions"] = len(lists)
    result["eval_s"] = round(time.time() - t0, 1)
    return result
