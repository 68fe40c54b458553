"""The run order of an experiment's variants: repeats as blocks, each block's order shuffled by a seed.

Why blocks: the same cell moves 10-39 % from node to node and drifts minutes apart on one node, more than
many format effects. Running every variant once per block, each on a fresh server, in a seeded order
that rotates from block to block, spreads that drift over all variants alike, and lets a comparison pair variants within a block
(bakeoff.results.spread). The schedule is a pure function of the variants, the repeats and the seed, so
the DAG, the records and a re-run all agree on it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple


class Slot(NamedTuple):
    """One server start of the schedule: variant ``engine``-``format`` as the ``order``-th of block ``block``."""

    block: int
    order: int
    engine: str
    format: str


def schedule(variants: Sequence[tuple[str, str]], repeats: int | Sequence[int], seed: int) -> list[Slot]:
    """Every variant once per block it runs in: a seeded shuffle, rotated by one place each block.

    The rotation makes the blocks a Latin square: over as many blocks as variants, each variant runs in
    each position once, so a position effect (the first server of a block on a cooler card, say) falls on
    all variants alike rather than on whichever a plain reshuffle happens to put first. ``repeats``:
    blocks for all variants, or one count per variant (a variant with fewer repeats sits out the later
    blocks; ``order`` counts only the variants of its block). The shuffle is ``random.Random(seed)``, the
    same on every Python 3, and adding a block leaves the earlier blocks' order unchanged.
    """
    counts = [repeats] * len(variants) if isinstance(repeats, int) else list(repeats)
    if len(counts) != len(variants):
        raise ValueError(f"{len(variants)} variants but {len(counts)} repeat counts")
    base = list(zip(variants, counts, strict=True))
    random.Random(seed).shuffle(base)
    out: list[Slot] = []
    for b in range(max(counts, default=0)):
        k = b % len(base)
        rotated = base[k:] + base[:k]
        out += [Slot(b, i, e, f) for i, ((e, f), _) in enumerate(x for x in rotated if x[1] > b)]
    return out


def slot_of(slots: Sequence[Slot], engine: str, fmt: str, block: int) -> Slot:
    """The slot of one variant in one block."""
    for s in slots:
        if (s.engine, s.format, s.block) == (engine, fmt, block):
            return s
    raise KeyError(f"{engine}-{fmt} has no slot in block {block}")


def previous(slots: Sequence[Slot], slot: Slot) -> Slot | None:
    """The server start that runs right before ``slot`` (None for the first)."""
    i = slots.index(slot)
    return slots[i - 1] if i > 0 else None
