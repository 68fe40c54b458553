"""Evaluation text that exists on every fresh machine, offline.

The embedded default cannot reach the Hugging Face hub, so its lm-eval tasks
read CPython's own ``pydoc_data.topics``: the English prose of the Python
Language Reference (79 documents, ~65k words). Both datasets are built
deterministically from it; their sha256 is recorded with every score, because
the text changes with the Python version.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from functools import cache
from typing import Any

# A sentence: starts with a capital, ends with . ! or ? before whitespace.
_SENTENCE = re.compile(r"[A-Z][^.!?]*[.!?](?=\s|$)")
MC_CHOICES = 4
MC_SEED = 20261202


@cache
def documents() -> list[dict[str, str]]:
    """The 79 topics in key order, as ``{"title", "text"}`` documents."""
    from pydoc_data.topics import topics

    return [{"title": k, "text": topics[k].strip()} for k in sorted(topics)]


def _prose_sentences(text: str) -> list[str]:
    """Sentences from prose paragraphs only (code and grammar blocks are indented)."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if not lines or any(ln.startswith((" ", "\t", ">>>")) for ln in lines):
            continue
        flat = " ".join(ln.strip() for ln in lines)
        out += [s.strip() for s in _SENTENCE.findall(flat)]
    return [s for s in out if 6 <= len(s.split()) <= 40 and "::" not in s and "|" not in s]


@cache
def mc_items(per_doc: int = 2) -> list[dict[str, Any]]:
    """Next-sentence multiple choice: which sentence follows this one in the reference?

    For each document, up to ``per_doc`` consecutive prose sentence pairs; the
    three distractors are sentences of other documents. A language model that
    reads the text scores well above the 25% chance level; one whose
    loglikelihoods are broken scores at chance.
    """
    rng = random.Random(MC_SEED)
    docs = documents()
    sentences = {d["title"]: _prose_sentences(d["text"]) for d in docs}
    pool = [(t, s) for t, ss in sentences.items() for s in ss]
    items: list[dict[str, Any]] = []
    for d in docs:
        ss = sentences[d["title"]]
        pairs = [(ss[i], ss[i + 1]) for i in range(0, len(ss) - 1, 2)][:per_doc]
        for context, answer in pairs:
            distractors: list[str] = []
            while len(distractors) < MC_CHOICES - 1:
                title, s = pool[rng.randrange(len(pool))]
                if title != d["title"] and s not in distractors and s != answer:
                    distractors.append(s)
            choices = [answer, *distractors]
            rng.shuffle(choices)
            items.append({"id": f"{d['title']}-{len(items)}", "context": context, "choices": choices,
                          "label": choices.index(answer)})
    return items


def fingerprint() -> str:
    """sha256 of both datasets as built on this Python (differs across Python versions)."""
    blob = json.dumps([documents(), mc_items()], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()
