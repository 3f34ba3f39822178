"""One place for paths, database URL, device and defaults.

Precedence everywhere: command-line flag > environment variable ``MGEO_INDEX_*`` > default here.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

ENV_PREFIX = "MGEO_INDEX_"
PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL_DIR = PACKAGE_DIR / "model" / "default"
DEFAULT_BI_MODEL = DEFAULT_MODEL_DIR / "bi"
DEFAULT_CROSS_MODEL = DEFAULT_MODEL_DIR / "cross"
# Profiles: which bundled cross-encoder reranks and labels (the bi-encoder and the index are the same for both).
# default: the small network with its feature head; accurate: the 12 x 384 teacher network with the same heads
# fitted around it (docs/models.md: its figures and cost).
PROFILES = ("default", "accurate")
PROFILE_CROSS_MODELS = {"default": DEFAULT_CROSS_MODEL, "accurate": DEFAULT_MODEL_DIR.parent / "accurate" / "cross"}
SAMPLE_CATALOG = PACKAGE_DIR / "data" / "sample_catalog.csv"
DB_FILENAME = "mgeo.db"
DEFAULT_INDEX_FACTORY = "auto"  # index.auto_factory: Flat while small, then IVF with quantized vectors
DEFAULT_CATALOG = "default"
DEFAULT_TOP_K = 10  # candidates retrieved and reranked per query: resolve, the API, normalize jobs, the benchmarks
LABELS = ("exact_match", "partial_match", "not_match")
# Queries and pair sides are cut to this many characters (after normalization) before encoding, n-gram
# search, features and scoring: far above any real address (the bi-encoder reads 62 characters, the
# cross-encoder 128 tokens a pair), and it bounds
# the work an arbitrarily long input can cause.
MAX_QUERY_CHARS = 256


def env(name: str, default: str | None = None) -> str | None:
    """Read ``MGEO_INDEX_<NAME>``; empty strings count as unset."""
    value = os.environ.get(ENV_PREFIX + name.upper())
    return value if value else default


class DatabaseNotGiven(ValueError):
    """The index directory's store is a database server's, and no URL for it was given."""


def database_url(index_dir: str | Path, db: str | None = None) -> str:
    """SQLAlchemy URL: ``--db`` > ``MGEO_INDEX_DB`` > SQLite file inside the index directory.

    Without a URL, an index directory whose ``index.json`` names a database server's (built with ``--db
    postgresql://…``) opens that one when its URL holds no password (libpq then reads one from ``PGPASSWORD`` or
    ``~/.pgpass``); one whose password was left out of ``index.json``, or another SQLite file while this directory
    has none, is refused rather than given a new, empty SQLite store."""
    index_dir = Path(index_dir).resolve()
    if index_dir.exists() and not index_dir.is_dir():
        raise NotADirectoryError(f"--index-dir {index_dir} is a file, not a directory")
    url = db or env("DB")
    if url:
        return with_driver(url)
    if not index_dir.exists():  # readers: nothing to read, and no empty store left behind
        raise FileNotFoundError(f"no index directory {index_dir}: build one first (mgeo-index build CATALOG "
                                f"--index-dir {index_dir})")
    local = f"sqlite:///{index_dir / DB_FILENAME}"
    recorded = _recorded_database(index_dir)
    # a server's database, or another SQLite file while this directory has none of its own (a directory
    # moved with its mgeo.db records its old path: that one is read)
    if recorded and not recorded.startswith("sqlite"):  # a database server's
        if ":***@" not in recorded:  # recorded whole: a password comes from PGPASSWORD, ~/.pgpass or the server's trust
            return with_driver(recorded)
        raise DatabaseNotGiven(
            f"{index_dir} was built with the database {recorded}, whose password index.json does not keep; pass --db "
            f"with its whole URL (or set {ENV_PREFIX}DB), or give the password in PGPASSWORD or ~/.pgpass and build "
            "with a URL without it")
    if recorded and recorded != local and not (index_dir / DB_FILENAME).exists():
        raise DatabaseNotGiven(
            f"{index_dir} was built with the database {recorded}; pass --db with its URL (or set "
            f"{ENV_PREFIX}DB): without one, a new empty SQLite store would be used")
    return local


def with_driver(url: str) -> str:
    """``postgres://`` and driverless ``postgresql://`` URLs get the PostgreSQL driver that is installed
    (SQLAlchemy 2.1 would otherwise pick psycopg 3, 2.0 psycopg2)."""
    import importlib.util

    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def _recorded_database(index_dir: Path) -> str | None:
    import json

    try:
        recorded = json.loads((index_dir / "index.json").read_text(encoding="utf-8")).get("database")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


# The number policies (mgeo_index.model.numbers applies them): strict, the default, never calls two addresses that
# write different numbers exact_match; loose leaves it to the scorer.
NUMBER_MODES = ("strict", "loose")


def check_numbers(mode: str | None, source: str = "--numbers") -> str:
    """``mode`` or the default number policy; a clear error naming where it came from (``source``) for anything
    else."""
    mode = mode or NUMBER_MODES[0]
    if mode not in NUMBER_MODES:
        raise ValueError(f"{source} must be one of {', '.join(NUMBER_MODES)}, not {mode!r}")
    return mode


def _chosen(flag: str | None, name: str, recorded: str | None) -> tuple[str | None, str]:
    """(value, where it came from) by the one precedence: the flag ``--name`` > ``MGEO_INDEX_NAME`` > ``recorded``
    (the index's)."""
    if flag:
        return flag, f"--{name}"
    if env(name.upper()):
        return env(name.upper()), ENV_PREFIX + name.upper()
    return recorded, f"the {name} the index recorded (build --{name})"


def numbers(mode: str | None = None, recorded: str | None = None) -> str:
    """The number policy (:mod:`mgeo_index.model.numbers`): ``--numbers`` > ``MGEO_INDEX_NUMBERS`` > ``recorded``
    (the index's, from ``build --numbers``) > strict: the precedence :func:`profile` follows too."""
    return check_numbers(*_chosen(mode, "numbers", recorded))


def answer_settings(recorded_numbers: str | None, recorded_profile: str | None) -> dict[str, str]:
    """What an index's answers are made with when no flag is given, and where each setting comes from, for people:
    ``{"profile": "default (default)", "numbers": "loose (recorded at build)"}`` (the precedence of
    :func:`numbers` and :func:`profile`: flag > environment > the index's > default)."""
    out = {}
    for name, recorded, value in (("profile", recorded_profile, profile(None, recorded_profile)[0]),
                                  ("numbers", recorded_numbers, numbers(None, recorded_numbers))):
        source = (f"MGEO_INDEX_{name.upper()}" if env(name.upper()) else "recorded at build" if recorded
                  else "a CUDA device is present" if name == "profile" and value == "accurate" else "default")
        out[name] = f"{value} ({source})"
    return out


def gpu_present() -> bool:
    """Whether this machine shows a GPU driver's device files (NVIDIA's, or WSL's): without them CUDA is never
    available, and asking torch (importing it: 1.5 s) is not needed."""
    return any(Path(name).exists() for name in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))


def device(name: str | None = None) -> str:
    """Torch device: ``--device`` > ``MGEO_INDEX_DEVICE`` > cuda when available > cpu."""
    import re

    chosen, source = _chosen(name, "device", None)
    if not chosen and not gpu_present():
        return "cpu"
    if chosen and not re.fullmatch(r"cpu|cuda(:\d+)?", chosen):
        raise ValueError(f"{source} must be cpu, cuda or cuda:N, not {chosen!r}")
    if chosen == "cpu":
        return chosen
    import torch

    if not chosen:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if chosen.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {chosen}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
        index = int(chosen.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {chosen}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return chosen


def bi_model_path(path: str | Path | None = None) -> Path:
    return Path(path or env("MODEL") or DEFAULT_BI_MODEL)


def cross_model_path(path: str | Path | None = None, profile: str | None = None) -> Path:
    """``path`` > ``MGEO_INDEX_CROSS_MODEL`` > the bundled cross-encoder of ``profile`` (default: ``default``)."""
    return Path(path or env("CROSS_MODEL") or PROFILE_CROSS_MODELS[check_profile(profile or "default")])


def check_profile(name: str, source: str = "--profile") -> str:
    if name not in PROFILES:
        raise ValueError(f"{source} must be one of {', '.join(PROFILES)}, not {name!r}")
    return name


def profile(name: str | None = None, recorded: str | None = None) -> tuple[str, str | None]:
    """(the profile, a note when it was chosen for a GPU): ``name`` (--profile) > ``MGEO_INDEX_PROFILE`` >
    ``recorded`` (the index's, from ``build --profile``) > accurate when a CUDA device is present > default.
    Never accurate silently on a CPU."""
    chosen, source = _chosen(name, "profile", recorded)
    if chosen:
        return check_profile(chosen, source), None
    if device() != "cpu":
        return "accurate", "profile accurate: a CUDA device is present (--profile default for the small cross-encoder)"
    return "default", None


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``, read once; empty elsewhere): ``amx_bf16``, ``avx512_bf16``, …"""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_kind(flags: frozenset[str] | None = None) -> str:
    """What a benchmark names the CPU by: ``amx`` (AMX tiles), ``avx512_bf16``, ``avx512``, ``avx2`` or ``other``."""
    flags = cpu_flags() if flags is None else flags
    for kind, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return kind
    return "other"


# The CPU backend used when neither --backend nor MGEO_INDEX_BACKEND says, by what the CPU has. Every candidate
# gives results that do not depend on what else is in a batch (a probability moves by < 1e-6 with its batch-mates
# and --top-k), and the CCKS dev macro-F1 of FP32 (`mgeo-index bench --backends torch,bf16,int8`, README):
# - `bf16` (bfloat16 Linear layers in fixed tiles, mgeo_index.runtime.quant) where the CPU has AMX: 1.6x int8 by rows
#   and 2x FP32 on both towers on an AMX machine (AMX's bf16 GEMM is 3x its int8 one through torch._int_mm);
# - `int8` by rows (per-channel weights, per-token activation scales, exact int32 sums) where it has VNNI: 2.0x
#   FP32 on an AVX512-VNNI machine, where bf16 (AVX512-BF16 without AMX) was 1.7x;
# - `torch` (FP32, the reference) elsewhere: on an AVX2-only CPU (AMD EPYC) torch._int_mm has no fast kernel and
#   bf16 is emulated, so int8 ran at 0.03x FP32 and bf16 at 0.13x (encode 12 and 54 against 446 addresses/s, one
#   thread).
# (torch.ao's dynamic int8 is not a candidate: it scales activations per batch, so a probability moves by ~1e-3
# with its batch-mates.)
def default_cpu_backend(flags: frozenset[str]) -> str:
    """``bf16`` with AMX, ``int8`` with VNNI (AVX512 or AVX), else ``torch`` (see above)."""
    if "amx_bf16" in flags:
        return "bf16"
    return "int8" if flags & {"avx512_vnni", "avx_vnni"} else "torch"


DEFAULT_CPU_BACKEND = default_cpu_backend(cpu_flags())
# Every inference backend (mgeo_index.runtime.backends implements them); here so that naming them imports no torch.
BACKENDS = ("torch", "bf16", "compile", "int8", "onnx", "numpy")


def cascade(enabled: bool | None = None) -> bool:
    """Whether a cross-encoder with a gate (or a group head with one) skips the network for the pairs its
    network-free scorer decides clearly (default on; ``MGEO_INDEX_CASCADE=0`` runs the network on every pair, e.g.
    to measure the gate)."""
    if enabled is not None:
        return enabled
    return env("CASCADE", "1").lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """Derived files (exported ONNX graphs, the gazetteer's tables): ``MGEO_INDEX_CACHE`` > ``$XDG_CACHE_HOME/mgeo-index`` > ``~/.cache/mgeo-index``."""
    chosen = env("CACHE")
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mgeo-index"
