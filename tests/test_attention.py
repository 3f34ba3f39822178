"""Attention over keys padded to a fixed block: the same bits whatever the batch's padded width."""
import csv

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mgeo_index import settings
from mgeo_index.runtime import attention, inference
from mgeo_index.query import labelling
from mgeo_index.model.loading import load_bi, load_cross


@pytest.mark.parametrize("width", [5, 16, 23])
def test_equals_the_fused_kernel_with_a_padding_mask(width):
    torch.manual_seed(width)
    q, k, v = (torch.randn(3, 4, width, 32) for _ in range(3))
    lengths = torch.tensor([width, width - 2, 1])
    keep = torch.arange(width)[None, :] < lengths[:, None]  # [batch, key]
    additive = torch.zeros(3, 1, 1, width).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    out, _ = attention.attention(torch.nn.Module().eval(), q, k, v, additive)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :]).transpose(1, 2)
    assert out.shape == (3, width, 4, 32)
    torch.testing.assert_close(out, reference, atol=2e-6, rtol=1e-5)
    boolean, _ = attention.attention(torch.nn.Module().eval(), q, k, v, keep[:, None, None, :])
    assert torch.equal(boolean, out)
    unmasked, _ = attention.attention(torch.nn.Module().eval(), q, k, v, None)
    torch.testing.assert_close(unmasked, F.scaled_dot_product_attention(q, k, v).transpose(1, 2), atol=2e-6, rtol=1e-5)


def _sample_addresses() -> list[str]:
    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        return [row["address"] for row in csv.DictReader(fh)]


@pytest.fixture
def one_thread():
    """torch on one thread for this test only (the rest of the process keeps its thread count: a job test compares a
    run in this process with one in a subprocess, and other thread counts round GEMMs differently)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("backend", ["torch", "int8", "bf16"])
def test_shipped_models_answer_the_same_in_any_batch(backend, one_thread):
    """300 addresses in one call, in two interleaved halves (other batch-mates, other padded widths) and some alone:
    identical vectors, and network probabilities within 1e-6 (only the 3-wide FP32 classifier and softmax after the
    last int8 layer may differ, in the last bits). With the fused kernel, int8 moved 1.6% of 1,500 CCKS dev pairs
    by more than 1e-6, up to 3.9e-3, and 2.7% of their vectors."""
    texts = _sample_addresses()
    candidates = texts[1:] + texts[:1]
    halves = [np.arange(0, len(texts), 2), np.arange(1, len(texts), 2)]
    bi = load_bi(device="cpu", backend=backend)
    together = inference.encode(bi, texts)
    for half in halves:
        assert np.array_equal(inference.encode(bi, [texts[i] for i in half]), together[half])
    for i in (0, 7, 150):
        assert np.array_equal(inference.encode(bi, texts[i]), together[i])
    cross = load_cross(device="cpu", backend=backend)
    cross.feature_head = cross.stack = cross.gate = None  # the network's own probabilities
    together = labelling.score_pairs(cross, texts, candidates)
    for half in halves:
        apart = labelling.score_pairs(cross, [texts[i] for i in half], [candidates[i] for i in half])
        assert np.abs(apart - together[half]).max() <= 1e-6
    for i in (0, 7, 150):
        assert np.abs(labelling.score_pairs(cross, texts[i : i + 1], candidates[i : i + 1])[0] - together[i]).max() <= 1e-6
