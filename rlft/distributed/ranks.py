"""How a batch splits between data-parallel ranks (learner ranks, rollout workers)."""

from __future__ import annotations


def rank_rows(rows: int, rank: int, world: int) -> range:
    """This rank's contiguous rows of a batch: shares as even as can be (the first ones one row more)."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))
