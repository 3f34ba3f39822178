"""Where the heavy, batch-by-batch work runs — one runner for builds (parsing and embedding catalog entries) and
normalize jobs (resolving rows), picked by name (``--runner local|ray``):

- :mod:`~mgeo_index.compute.task`: :class:`~mgeo_index.compute.task.Task`, one kind of work as any runner maps
  it (a function built once in this process; an actor class built once per Ray actor);
- :mod:`~mgeo_index.compute.local`: :class:`~mgeo_index.compute.local.LocalRunner`, this process (on a CPU,
  several items side by side, one thread each, where the task allows);
- :mod:`~mgeo_index.compute.ray`: :class:`~mgeo_index.compute.ray.RayRunner`, Ray Data actor pools, and the
  Ray plumbing (joining a cluster, checking its GPUs, ordered actor-pool maps);
- :mod:`~mgeo_index.compute.runners`: :func:`~mgeo_index.compute.runners.make_runner`, by name.

A runner only maps items to results, in input order, and touches no store or file: the driver reads, commits
each result as it comes back, writes files and passes the crash points in the same order whichever runner
computes, so work killed at any moment is finished by running it again, on either runner.
"""
