"""The one batcher every path uses (build, resolve, match, jobs, service, evaluation).

- Inputs are tokenized once per batch, never per item.
- Items are sorted by length and cut into batches by a token budget, each padded to its own
  longest item (rounded up to a multiple of 8 on CUDA for tensor cores).
- ``torch.inference_mode``; on CUDA: FP16 autocast, pinned host memory, ``non_blocking`` copies on a
  side stream so the upload of batch n+1 overlaps the forward pass of batch n; Python-side
  tokenization of the next batch overlaps GPU work too because kernels launch asynchronously.
- Results come back in input order.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

PRECISIONS = ("fp32", "fp16", "bf16")
# Tokens per batch (padded size). On the CPU smaller batches stay in cache: with int8 on one thread, 4,096
# tokens encoded 1.7× and scored pairs 2.0× faster than 16,384 in the same run (README, `mgeo-index bench`);
# 2,048 against 4,096 (best of 4 interleaved rounds, 2,000 CCKS addresses / 1,000 pairs): 1 thread
# encode 1.08×, pairs 1.25×; 2 threads 1.01× / 1.10×; 1,024 was no better.
GPU_MAX_TOKENS = 16384
CPU_MAX_TOKENS = 2048


def length_sorted_batches(lengths: Sequence[int], *, max_tokens: int = 16384, max_batch: int = 512) -> list[np.ndarray]:
    """Indices grouped into batches: longest first, each batch's padded size within ``max_tokens``."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, int(lengths[i]), 1)
        if current and (longest_if_added * (len(current) + 1) > max_tokens or len(current) >= max_batch):
            batches.append(np.asarray(current))
            current, longest_if_added = [], max(int(lengths[i]), 1)
        current.append(int(i))
        longest = longest_if_added
    if current:
        batches.append(np.asarray(current))
    return batches


def input_batches(first: Sequence[str], second: Sequence[str] | None, *, max_length: int, max_tokens: int,
                  max_batch: int) -> list[np.ndarray]:
    """:func:`length_sorted_batches` of texts (or pairs) by their length in tokens as the encoders read them
    (characters, [CLS] / [SEP] included, cut at ``max_length``)."""
    lengths = [min(len(a) + (len(second[i]) if second is not None else 0) + 3, max_length) for i, a in enumerate(first)]
    return length_sorted_batches(lengths, max_tokens=max_tokens, max_batch=max_batch)


def default_precision(device: str) -> str:
    return "fp16" if str(device).startswith("cuda") else "fp32"


def _autocast(device: str, precision: str):
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type="cuda" if str(device).startswith("cuda") else "cpu", dtype=dtype)


def _tokenize(tokenizer, first: list[str], second: list[str] | None, max_length: int, cuda: bool,
              tensors: str = "pt") -> dict:
    return tokenizer(
        first,
        second,
        padding=True,
        truncation=True,
        max_length=max_length,
        pad_to_multiple_of=8 if cuda else None,
        return_tensors=tensors,
    )


def _run(
    module,
    tokenizer,
    first: Sequence[str],
    second: Sequence[str] | None,
    *,
    max_length: int,
    output: str,
    device: str | None,
    precision: str | None,
    max_tokens: int | None,
    max_batch: int,
    on_batch: Callable[[int], None] | None,
    temperature: float = 1.0,
) -> np.ndarray:
    """``output`` of each item, input order: ``normalized`` (L2-normalized rows), ``logits`` or ``probabilities``
    (softmax at ``temperature``), float32. A torch module (on the CPU, or pipelined on CUDA) or a model of
    :mod:`mgeo_index.model.numpy_backend` (``backend == "numpy"``: its ``outputs`` computes one batch, no torch
    imported); the batches and their order are this function's either way."""
    numpy_model = getattr(module, "backend", None) == "numpy"
    if not numpy_model:
        device = str(device or next(module.parameters()).device)
    cuda = not numpy_model and device.startswith("cuda")
    max_tokens = max_tokens or (GPU_MAX_TOKENS if cuda else CPU_MAX_TOKENS)
    batches = input_batches(first, second, max_length=max_length, max_tokens=max_tokens, max_batch=max_batch)

    def inputs(idx: np.ndarray, tensors: str) -> dict:
        return dict(_tokenize(tokenizer, [first[i] for i in idx], [second[i] for i in idx] if second is not None else None,
                              max_length, cuda, tensors))

    if numpy_model:
        return _in_order(len(first), batches, lambda idx: module.outputs(inputs(idx, "np"), output, temperature),
                         on_batch)
    import torch

    from mgeo_index.runtime import kernels

    postprocess = {"normalized": lambda x: kernels.l2_normalize(x.float()), "logits": lambda x: x.float(),
                   "probabilities": lambda x: kernels.softmax(x.float(), temperature=temperature)}[output]
    runner = getattr(module, "runner", None)  # set by backends.apply (ONNX Runtime, int8, compiled…)
    runner = module if runner is None else runner
    with torch.inference_mode(), _autocast(device, precision or default_precision(device)):
        if cuda:
            return _in_order_cuda(len(first), batches, lambda idx: inputs(idx, "pt"), runner, postprocess, device,
                                  on_batch)
        return _in_order(len(first), batches, lambda idx: postprocess(runner(**inputs(idx, "pt"))).float().numpy(),
                         on_batch)


def _in_order(n: int, batches: list[np.ndarray], compute: Callable[[np.ndarray], np.ndarray],
              on_batch: Callable[[int], None] | None) -> np.ndarray:
    """``compute(idx)`` of each batch of item indices, put back in input order: float32 (n, width)."""
    out: np.ndarray | None = None
    for idx in batches:
        result = compute(idx)
        if out is None:
            out = np.empty((n, result.shape[1]), dtype=np.float32)
        out[idx] = result
        if on_batch is not None:
            on_batch(len(idx))
    return out if out is not None else np.empty((0, 0), dtype=np.float32)


def _in_order_cuda(n: int, batches: list[np.ndarray], inputs: Callable[[np.ndarray], dict], runner, postprocess,
                   device: str, on_batch: Callable[[int], None] | None) -> np.ndarray:
    """:func:`_in_order` on a CUDA device: each batch's inputs pinned and uploaded on a side stream while the batch
    before runs, the results brought back with one sync at the end."""
    import torch

    copy_stream = torch.cuda.Stream()

    def upload(idx: np.ndarray) -> dict:
        with torch.cuda.stream(copy_stream):
            return {k: v.pin_memory().to(device, non_blocking=True) for k, v in inputs(idx).items()}

    pending = upload(batches[0]) if batches else None
    launched: list[torch.Tensor] = []  # one a batch, in the order of ``batches``
    for b, idx in enumerate(batches):
        batch = pending
        torch.cuda.current_stream().wait_stream(copy_stream)
        for tensor in batch.values():  # allocated on the copy stream, used on this one
            tensor.record_stream(torch.cuda.current_stream())
        launched.append(postprocess(runner(**batch)))
        # tokenize + upload the next batch while this one runs on the GPU
        pending = upload(batches[b + 1]) if b + 1 < len(batches) else None
        if on_batch is not None:
            on_batch(len(idx))
    results = iter(launched)
    return _in_order(n, batches, lambda idx: next(results).float().to("cpu", non_blocking=False).numpy(), None)


def encode(
    model,
    texts: str | Sequence[str],
    *,
    device: str | None = None,
    precision: str | None = None,
    max_tokens: int | None = None,
    max_batch: int = 512,
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Embed addresses with a :class:`BiEncoder`; float32 (n, dim), L2-normalized, input order.

    One string in → one vector (dim,) out, like sentence-transformers' ``encode``.
    """
    single = isinstance(texts, str)
    items = [texts] if single else list(texts)
    if not items:
        return np.empty((0, model.dim), dtype=np.float32)
    vectors = _run(
        model,
        model.tokenizer,
        items,
        None,
        max_length=model.max_length,
        output="normalized",
        device=device,
        precision=precision,
        max_tokens=max_tokens,
        max_batch=max_batch,
        on_batch=on_batch,
    )
    return vectors[0] if single else vectors


def pair_outputs(cross, queries: Sequence[str], candidates: Sequence[str], *, output: str = "logits",
                 device: str | None = None, precision: str | None = None, max_tokens: int | None = None,
                 max_batch: int = 512, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """The cross-encoder network's ``logits`` (n, 3), or its ``probabilities`` at the model's temperature, on every
    pair: no feature head, no cascade (those are the labelling chain's: :mod:`mgeo_index.query.labelling`)."""
    if len(queries) != len(candidates):
        raise ValueError(f"{len(queries)} queries but {len(candidates)} candidates")
    return _run(cross, cross.tokenizer, list(queries), list(candidates), max_length=cross.max_length, output=output,
                device=device, precision=precision, max_tokens=max_tokens, max_batch=max_batch, on_batch=on_batch,
                temperature=cross.temperature)


def network_logits(cross, queries: Sequence[str], candidates: Sequence[str], *, device: str | None = None) -> np.ndarray:
    """The cross-encoder network's raw logits (n, 3) at temperature 1 on every pair: no feature head, no cascade."""
    return pair_outputs(cross, queries, candidates, device=device)


def iter_chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
