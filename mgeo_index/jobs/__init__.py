"""`mgeo-index normalize`: tie every row of a file to the catalog, as a resumable job in the store (the package is
named jobs: "normalize" alone is the address text normalization, :func:`mgeo_index.text.normalize`).

- :mod:`~mgeo_index.jobs.policy`: the per-row decision (matched / ambiguous / unmatched / rejected)
  and the options' defaults;
- :mod:`~mgeo_index.jobs.inputs`: reading CSV/TSV or Parquet input in chunks of records;
- :mod:`~mgeo_index.jobs.parts`: part files and the merged output;
- :mod:`~mgeo_index.jobs.job`: the job (checkpoints, resuming, refusals) over a runner passed in;
- :mod:`~mgeo_index.jobs.resolving`: resolving chunks as a task of either runner (:mod:`mgeo_index.compute`);
- :mod:`~mgeo_index.jobs.run`: :func:`normalize_file`, a job on the runner named.
"""
from __future__ import annotations

from mgeo_index.jobs.inputs import Chunk, Record, fingerprint_input, input_format, open_input
from mgeo_index.jobs.job import (
    JobOptions,
    JobResult,
    Progress,
    Resolving,
    effective_status,
    index_identity,
    list_jobs,
    run_job,
)
from mgeo_index.jobs.policy import (
    ADMIN_COLUMNS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MARGIN,
    DEFAULT_MIN_PROBABILITY,
    DEFAULT_TOP_K,
    RESULT_COLUMNS,
    STATUSES,
    JobError,
    Policy,
    decide,
    relevance,
)
from mgeo_index.jobs.run import normalize_file

__all__ = [
    "ADMIN_COLUMNS", "DEFAULT_BATCH_SIZE", "DEFAULT_CHUNK_SIZE", "DEFAULT_MARGIN", "DEFAULT_MIN_PROBABILITY",
    "DEFAULT_TOP_K", "RESULT_COLUMNS", "STATUSES",
    "Chunk", "JobError", "JobOptions", "JobResult", "Policy", "Progress", "Record", "Resolving",
    "decide", "effective_status", "fingerprint_input", "index_identity", "input_format", "list_jobs",
    "normalize_file", "open_input", "relevance", "run_job",
]
