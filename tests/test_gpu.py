"""GPU paths, exercised on a machine with CUDA (scripts/device_check.sh); skipped, saying why, elsewhere."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU paths run in scripts/device_check.sh")

from mgeo_index import settings  # noqa: E402
from mgeo_index.runtime import inference, kernels
from mgeo_index.query import labelling
from mgeo_index.model.bi_encoder import load_bi_encoder  # noqa: E402
from mgeo_index.model.cross_encoder import load_cross_encoder  # noqa: E402

ADDRESSES = [line.split(",")[2] for line in settings.SAMPLE_CATALOG.read_text(encoding="utf-8").splitlines()[1:]]


@pytest.mark.parametrize("shape", [(1, 7), (33, 130), (4096, 256), (1000, 768)])
def test_triton_kernels_match_torch_on_cuda(shape):
    x = torch.randn(*shape, device="cuda") * 5
    torch.testing.assert_close(kernels.l2_normalize(x, backend="triton"), kernels.torch_l2_normalize(x), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kernels.softmax(x, temperature=1.7, backend="triton"),
                               kernels.torch_softmax(x, temperature=1.7), atol=1e-6, rtol=1e-5)
    half = kernels.l2_normalize(x, out_dtype=torch.float16, backend="triton")
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), kernels.torch_l2_normalize(x), atol=2e-3, rtol=2e-3)


def test_fp16_engine_agrees_with_fp32():
    bi = load_bi_encoder(settings.DEFAULT_BI_MODEL).to("cuda")
    fp16 = inference.encode(bi, ADDRESSES, device="cuda", precision="fp16")
    fp32 = inference.encode(bi, ADDRESSES, device="cuda", precision="fp32")
    cpu = inference.encode(bi.to("cpu"), ADDRESSES, device="cpu")
    assert np.min(np.sum(fp16 * fp32, axis=1)) > 0.999
    assert np.min(np.sum(fp32 * cpu, axis=1)) > 0.9999
    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL).to("cuda")
    shuffled = ADDRESSES[::-1]
    p16 = labelling.score_pairs(cross, ADDRESSES, shuffled, device="cuda", precision="fp16")
    p32 = labelling.score_pairs(cross, ADDRESSES, shuffled, device="cuda", precision="fp32")
    assert np.mean(p16.argmax(1) == p32.argmax(1)) > 0.98
    assert np.abs(p16 - p32).max() < 0.05


def test_faiss_gpu_index_matches_cpu():
    faiss = pytest.importorskip("faiss", reason="FAISS is not installed here (scripts/device_check.sh carries no faiss wheel)")
    from mgeo_index.index import faiss_index

    if faiss.get_num_gpus() == 0:
        pytest.skip("this FAISS build has no GPU support: pip install -e '.[gpu]'")
    rng = np.random.default_rng(0)
    base = rng.normal(size=(20000, 256)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:100] + 0.01 * rng.normal(size=(100, 256)).astype(np.float32)
    ids = np.arange(20000, dtype=np.int64) * 3 + 7
    cpu = faiss_index.make_index(256, "Flat")
    faiss_index.add(cpu, base, ids)
    gpu = faiss_index.to_gpu(faiss_index.make_index(256, "Flat"))
    assert faiss_index.is_gpu_index(gpu)
    faiss_index.add(gpu, base, ids)
    s_cpu, i_cpu = faiss_index.search(cpu, queries, 10)
    s_gpu, i_gpu = faiss_index.search(gpu, queries, 10)
    assert np.mean(i_cpu == i_gpu) > 0.99
    np.testing.assert_allclose(s_cpu, s_gpu, atol=1e-4)
