"""The local engine: one resolver in this process resolves every chunk, micro-batch by micro-batch."""
from __future__ import annotations

from collections.abc import Iterator

from mgeo_index import settings
from mgeo_index.normalize.inputs import Chunk
from mgeo_index.normalize.job import Engine, Resolving
from mgeo_index.normalize.policy import resolve_outcomes


def local_engine(*, device: str | None = None, resolver=None) -> Engine:
    """The local engine on ``device``; ``resolver``: one already opened (benchmarks, tests), whose backend
    the job then runs with, instead of one opened for the job."""

    def outcomes(chunks: Iterator[Chunk], resolving: Resolving) -> Iterator[tuple[Chunk, list[dict]]]:
        opened = resolver
        if opened is None:
            from mgeo_index.query.resolver import open_resolver

            opened = open_resolver(resolving.index_dir, db=resolving.db, model=resolving.model,
                                   cross_model=resolving.cross_model, device=device, backend=resolving.backend)
        memo: dict[str, dict] = {}  # answers of this run, reused by later chunks' repeats
        return ((c, resolve_outcomes(opened, c.valid_addresses(), resolving.policy, resolving.batch_size, memo))
                for c in chunks)

    return Engine(name="local", device=settings.device(device), outcomes=outcomes,
                  backend=getattr(getattr(resolver, "bi", None), "backend", None))
