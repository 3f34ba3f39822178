"""`mgeo-index serve`: the online service (FastAPI app, dynamic batcher, cache, metrics)."""
