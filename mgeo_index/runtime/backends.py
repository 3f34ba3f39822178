"""CPU inference backends: how a loaded model's forward pass is run.

One model object (tokenizer, labels, feature head, fingerprint) keeps its attributes; a backend only
sets ``model.runner``, the callable :mod:`mgeo_index.runtime.inference` calls with each batch's tensors (every CPU
backend computes in its own precision inside the runner; none asks the batcher for autocast):

- ``torch``: the module itself, FP32 (the reference);
- ``bf16``: the transformer's Linear layers in bfloat16, computed in fixed tiles of rows so that batch-mates
  change nothing (:mod:`mgeo_index.runtime.quant`); attention, LayerNorm and the residual stream stay FP32
  (AMX CPUs: 1.6x int8 by rows, 2x FP32; the CPU default where the CPU has AMX);
- ``compile``: ``torch.compile(dynamic=True)`` (Inductor; compiles on the first batches);
- ``int8``: the Linear layers in int8 with per-channel weight and per-row activation scales, summed
  exactly in int32 (:mod:`mgeo_index.runtime.quant`), so batch-mates change nothing;
- ``onnx``: ONNX Runtime on a graph exported with dynamic batch and sequence axes, cached in
  :func:`mgeo_index.settings.cache_dir` under the model's fingerprint so it is exported once.

Every CPU backend but ``onnx`` runs the transformer with :mod:`mgeo_index.runtime.attention` (keys padded to a fixed
block), so an item's outputs are the same bits alone or in any batch. On CUDA only ``torch`` applies (the
engine's FP16 path, fused attention). Which backend runs is :mod:`mgeo_index.runtime.plan`'s choice.
"""
from __future__ import annotations

import hashlib
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import torch

from mgeo_index import files, settings
from mgeo_index.runtime import attention, parallel
from mgeo_index.runtime.plan import torch_plan

BACKENDS = settings.BACKENDS
ONNX_OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Backends that need an optional extra: backend → (extra, the modules it installs that the backend imports).
EXTRAS = {"onnx": ("onnx", ("onnxruntime", "onnx"))}


class MissingExtra(ImportError):
    """A backend whose optional extra is not installed; the message names the ``pip install`` that adds it."""


def check(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {name!r}")
    return name


def require(name: str) -> str:
    """:func:`check` ``name``, and that the modules of its optional extra are installed (else :class:`MissingExtra`).

    Looks the modules up without importing them, so asking costs nothing.
    """
    check(name)
    extra, modules = EXTRAS.get(name, (None, ()))
    missing = [module for module in modules if not _installed(module)]
    if missing:
        raise MissingExtra(f"the {name} backend needs {' and '.join(missing)}: pip install 'mgeo-index[{extra}]'")
    return name


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, a module without a spec
        return False


def apply(model: torch.nn.Module, name: str | None = None, *, device: str = "cpu",
          in_place: bool = False) -> torch.nn.Module:
    """Set ``model.runner`` / ``model.backend`` / ``model.plan`` for backend ``name`` (default: the plan's, ``numpy``,
    which computes the models :mod:`mgeo_index.model.loading` loads for it, read as the CPU's default here:
    :func:`mgeo_index.runtime.plan.torch_plan`). ``in_place``: ``int8`` and ``bf16`` convert the model itself
    instead of a copy, dropping its FP32 Linear weights (a model loaded for inference only: 12 MB less per
    shipped network in every process); such a model then runs on that backend alone."""
    chosen = torch_plan(name, device)
    name = check(chosen.backend)
    converted = model.__dict__.get("converted")
    if converted is not None:
        if name != converted:
            raise ValueError(f"this model was loaded for the {converted} backend only (its FP32 weights were dropped); "
                             f"load it again to run it on {name}")
        return model
    require(name)
    if not str(device).startswith("cuda"):
        parallel.one_blas_thread()  # numpy's idle BLAS threads would spin on the cores torch's need
    if not str(device).startswith("cuda") and name != "onnx":
        attention.use(model)  # the same bits whatever the batch's padded width (before any copy below)
    else:
        attention.use_fused(model)  # CUDA (FP16 flash attention) and the ONNX graph: PyTorch's fused attention
    runner = None
    if name == "compile":
        runner = torch.compile(model, dynamic=True)
    elif name == "int8":
        runner = _quantized(model, in_place)
    elif name == "bf16":
        runner = _bf16(model, in_place)
    elif name == "onnx":
        runner = OnnxRunner(export_onnx(model))
    if in_place and name in ("int8", "bf16"):
        model.__dict__["converted"] = name  # runner None: the model itself computes as the backend does
    # plain attributes, not registered submodules: state_dict(), .to() and saving never see the runner
    model.__dict__.update(backend=name, runner=runner, plan=chosen)
    return model


def ensure(model: torch.nn.Module, name: str | None = None, *, device: str = "cpu") -> torch.nn.Module:
    """:func:`apply` backend ``name``; without one, the default only where the model has no backend yet
    (a model passed in already set up keeps its own)."""
    if name is not None or getattr(model, "backend", None) is None:
        apply(model, name, device=device)
    return model


def computed_apart(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The parts of ``model`` that its forward pass (a runner) does not compute: a feature head, which the model
    computes itself in FP32 (``head_logits``) on every backend, so a conversion in place leaves it as it is."""
    head = getattr(model, "feature_head", None)
    return [head] if isinstance(head, torch.nn.Module) else []


def _quantized(model: torch.nn.Module, in_place: bool = False) -> torch.nn.Module | None:
    """A copy whose Linear layers compute in int8 by rows (:func:`mgeo_index.runtime.quant.quantized_copy`); ``in_place``:
    the model itself converted (None: no runner)."""
    from mgeo_index.runtime import quant

    model.__dict__.pop("runner", None)  # a runner applied before is not part of the copy
    if in_place:
        quant.quantize_linears(model, keep=computed_apart(model))
        return None
    return quant.quantized_copy(model).eval()


def _bf16(model: torch.nn.Module, in_place: bool = False) -> torch.nn.Module | None:
    """A copy whose transformer computes its Linear layers in bfloat16 tiles (:func:`mgeo_index.runtime.quant.bf16_copy`);
    what follows the transformer (a projection) stays FP32. ``in_place``: the model itself converted (None)."""
    from mgeo_index.runtime import quant

    model.__dict__.pop("runner", None)
    parts = [part for part in model.children() if attention.is_transformer(part)]
    if in_place:
        for part in parts:
            quant.bf16_linears(part)
        return None
    return quant.bf16_copy(model, parts).eval()


def onnx_path(model) -> Path:
    """The cached graph of ``model``: keyed by its saved files' fingerprint, or for a model never saved
    (trained or built in this process) by a digest of its weights and settings, so two such models never
    share one. (A model loaded from files and then changed in place keeps its files' fingerprint: save it
    first.)"""
    kind = type(model).__name__.lower()
    key = model.fingerprint or f"mem{_weights_digest(model)}"
    return settings.cache_dir() / f"{kind}-{key}-opset{ONNX_OPSET}-torch{torch.__version__.split('+')[0]}.onnx"


def _weights_digest(model: torch.nn.Module) -> str:
    """What the exported graph depends on: the transformer's config, the pooling, every weight."""
    digest = hashlib.sha256()
    for part in model.children():
        config = getattr(part, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            digest.update(config.to_json_string().encode())
    digest.update(str(getattr(model, "pooling", "")).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        tensor = tensor.detach().cpu().contiguous().reshape(-1)  # 1-d: 0-d tensors cannot be viewed as bytes
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


class _Exportable(torch.nn.Module):
    """The model's forward with all three inputs positional (what the ONNX graph takes)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model.forward(input_ids, attention_mask, token_type_ids)


def export_onnx(model) -> Path:
    """Export (once per model fingerprint) to ONNX with dynamic batch and sequence axes; returns the file."""
    path = onnx_path(model)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    sample = model.tokenizer(["北京市朝阳区建国路88号", "深圳"], padding=True, return_tensors="pt")
    ids = sample["input_ids"]
    args = (ids, sample["attention_mask"], sample.get("token_type_ids", torch.zeros_like(ids)))
    axes = {name: {0: "batch", 1: "sequence"} for name in _INPUTS}
    axes["output"] = {0: "batch"}

    def write(tmp: str) -> None:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes about HF's Python-side checks; the tests compare outputs
            torch.onnx.export(
                _Exportable(model).eval(), args, tmp, input_names=list(_INPUTS), output_names=["output"],
                dynamic_axes=axes, opset_version=ONNX_OPSET, dynamo=False,
            )

    files.replace_atomic(path, write)  # a concurrent or interrupted export never leaves half a file
    return path


class OnnxRunner:
    """Callable like the torch module: tensors in, a torch tensor out, computed by ONNX Runtime."""

    def __init__(self, path: Path):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise MissingExtra("the onnx backend needs onnxruntime: pip install 'mgeo-index[onnx]'") from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        ids = input_ids.numpy()
        feed = {
            "input_ids": ids,
            "attention_mask": attention_mask.numpy(),
            "token_type_ids": token_type_ids.numpy() if token_type_ids is not None else np.zeros_like(ids),
        }
        return torch.from_numpy(self.session.run(None, feed)[0])
