"""How a model runs, decided in one place: the plan.

A plan names the executor (torch, NumPy, ONNX Runtime), the numerics of its Linear layers, the attention and
whether the module is compiled, printed as FAISS prints a factory string: ``torch/int8-rows/blocked``,
``numpy/fp32/blocked``, ``torch/fp16/fused@cuda``. :func:`choose` is a pure function of what decides it — the
backend asked for, the device, how many queries a process will answer, whether the NumPy executor computes the
model, the CPU's flags — and :func:`plan` feeds it this process's flags, environment and device. The CLI, the
Python API, the service, jobs and their worker processes and Ray actors, builds and the benchmark all take their
plan from here; a build and a job record it (``index.json``, the job's parameters), and ``check`` shows it.

The choice:

- on CUDA: torch, FP16 autocast, PyTorch's fused attention (``torch`` is the only backend there: another one asked
  for is refused, but ``numpy``, which falls back);
- on a CPU, the backend asked for (``--backend`` > ``MGEO_INDEX_BACKEND``), else the CPU's default
  (:func:`mgeo_index.settings.default_cpu_backend`: ``bf16`` with AMX, ``int8`` with VNNI, FP32 ``torch``
  elsewhere), except that a one-shot (at most :data:`ONE_SHOT_QUERIES` queries, nothing asked for) runs on the
  NumPy executor where the default is FP32 ``torch``, whose numerics it computes (no torch to import: 1.6 s and
  215 MB instead of 3.1 s and 414 MB for one address on a 2-core AVX2 EPYC; on 2,000 CCKS queries over the CCKS
  catalog the same rankings and labels, probabilities within 1e-6: ``scripts/side_by_side.py answers --backend
  numpy``). Batches run faster on torch, and the int8 and bf16 defaults round activations to levels that a
  last-bit difference can move, so where they are the default a one-shot stays on them (answers would differ on
  near-ties);
- ``numpy`` computes the Linear layers as the CPU's default backend would (int8 by rows with VNNI, bfloat16 tiles
  with AMX, FP32 elsewhere) and runs only where it can: on a CPU, for the models it computes; elsewhere a model
  asked to run on it runs as a torch module on the default (:func:`torch_plan`);
- every CPU plan but ONNX Runtime's attends in fixed key blocks (:mod:`mgeo_index.runtime.attention`: an item's
  outputs are the same bits alone or in any batch); ``compile`` is torch's FP32 under ``torch.compile``.
"""
from __future__ import annotations

from dataclasses import dataclass

from mgeo_index import settings

# A resolve of at most this many addresses is a one-shot. On a 2-core AVX2 EPYC over the CCKS catalog, whole
# process: 50 addresses 4.78 s on the numpy backend against 5.65 s on torch, 200 addresses 10.93 s against 7.94 s
# (41 against 15 ms an address once started: they break even at about 85).
ONE_SHOT_QUERIES = 64
#: How each backend's Linear layers compute on a CPU (numpy: as the CPU's default does).
NUMERICS = {"torch": "fp32", "compile": "fp32", "onnx": "fp32", "int8": "int8-rows", "bf16": "bf16-tiles"}
EXECUTORS = {"numpy": "numpy", "onnx": "onnxruntime"}  # the rest: torch
# int8 by rows, as both executors compute it (runtime/quant.py for torch, model/numpy_backend.py for NumPy):
LEVELS = 127.0  # symmetric int8: -127 … 127
MIN_FEATURES = 16  # narrower Linear layers (a 3-label classifier) stay FP32: they cost nothing


@dataclass(frozen=True)
class Plan:
    """How a model runs (see the module docstring); ``str()`` is its one-line name."""

    backend: str  # what --backend calls it: torch, bf16, compile, int8, onnx, numpy
    device: str  # cpu, cuda, cuda:N
    executor: str  # torch, numpy, onnxruntime
    numerics: str  # fp32, fp16, int8-rows, bf16-tiles
    attention: str  # blocked (the same bits in any batch) or fused (PyTorch's / the ONNX graph's)
    compiled: bool = False

    def __str__(self) -> str:
        name = f"{self.executor}/{self.numerics}/{self.attention}" + ("/compiled" if self.compiled else "")
        return name if self.device == "cpu" else f"{name}@{self.device}"


def choose(requested: str | None, device: str, flags: frozenset[str], *, queries: int | None = None,
           numpy_computes: bool = True) -> Plan:
    """The plan for ``requested`` (a backend name or None) on ``device``, for a process that answers ``queries``
    queries (None: any number, a service, an index opened in Python, a job), on a CPU with ``flags``;
    ``numpy_computes``: whether the NumPy executor computes the model (:func:`mgeo_index.model.numpy_backend.computes`).
    Pure: the same arguments, the same plan."""
    if requested is not None and requested not in settings.BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(settings.BACKENDS)}, not {requested!r}")
    if str(device).startswith("cuda"):
        if requested not in (None, "torch", "numpy"):  # numpy: asked for one-shot commands, which a GPU runs on torch
            raise ValueError(f"backend {requested!r} is for the CPU; on {device} use --backend torch (FP16 autocast)")
        return Plan("torch", device, "torch", "fp16", "fused")
    default = settings.default_cpu_backend(flags)
    name = requested or default
    if requested is None and default == "torch" and queries is not None and queries <= ONE_SHOT_QUERIES:
        name = "numpy"  # a one-shot, where the NumPy executor computes the default's numerics: no torch to import
    if name == "numpy" and not numpy_computes:
        name = default
    numerics = NUMERICS[default] if name == "numpy" else NUMERICS[name]
    return Plan(name, "cpu", EXECUTORS.get(name, "torch"), numerics, "fused" if name == "onnx" else "blocked",
                compiled=name == "compile")


def requested(name: str | None = None) -> str | None:
    """The backend asked for: ``name`` (--backend) > ``MGEO_INDEX_BACKEND`` > None; refused (naming where it came
    from) when it is none of :data:`mgeo_index.settings.BACKENDS`."""
    chosen, source = settings._chosen(name, "backend", None)
    if chosen and chosen not in settings.BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(settings.BACKENDS)}, not {chosen!r}")
    return chosen or None


def plan(name: str | None = None, device: str | None = "cpu", *, queries: int | None = None,
         numpy_computes: bool = True) -> Plan:
    """:func:`choose` for this process: the backend asked for (:func:`requested`), ``device`` (None: this machine's,
    :func:`mgeo_index.settings.device`, which checks a device it is given) and this CPU's flags."""
    return choose(requested(name), str(device) if device else settings.device(None), settings.cpu_flags(),
                  queries=queries, numpy_computes=numpy_computes)


def torch_plan(name: str | None = None, device: str | None = "cpu") -> Plan:
    """The plan of a model that runs as a torch module (a build's or an update's embedding, the benchmark's, a model
    the NumPy executor does not compute): :func:`plan`, with ``numpy`` read as the CPU's default, so that
    ``MGEO_INDEX_BACKEND=numpy`` set for one-shot commands does not stop the others."""
    return plan(name, device, numpy_computes=False)
