"""`mgeo-index serve`: the online service (FastAPI app, dynamic batcher, cache, metrics)."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # Host header names a server bound to loopback answers to
