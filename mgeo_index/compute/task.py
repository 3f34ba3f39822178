"""One kind of work, as a runner maps it over items (:mod:`mgeo_index.compute`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """``local()`` builds, once, the function this process computes an item's result with; on Ray,
    ``actor(**kwargs)`` is built once per actor (so it loads its models once) and called with one row per item:
    ``{"seq": position, **pack(item)}``; ``unpack(item, row)`` turns the actor's output row back into the result.
    Both must give the same result for the same item.

    ``gpus``: the actors take the runner's GPUs per worker (else one CPU each: a small model's work).
    ``items_per_actor``: items per actor in one Ray Data execution (a pool lives for one execution and each actor
    loads its model when it starts, so a window should give every actor a good deal of work while bounding what
    the driver holds). ``side_by_side``: the local runner may compute several items at once on its threads (the
    function must then be safe to call from several threads)."""

    local: Callable[[], Callable[[Any], Any]]
    actor: type
    pack: Callable[[Any], dict[str, Any]]
    unpack: Callable[[Any, dict[str, Any]], Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    gpus: bool = False
    items_per_actor: int = 1
    side_by_side: bool = True
    plan: Any = None  # how its model computes wherever it runs (mgeo_index.runtime.plan.Plan), when it has one
