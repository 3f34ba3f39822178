import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder

TEXTS = ["北京市朝阳区建国路88号", "上海徐汇", "广东省深圳市南山区南山街道中山路75号东方科技园9号楼", "人民路1号", "x"]


@given(st.lists(st.integers(min_value=1, max_value=200), max_size=60), st.integers(64, 2048), st.integers(1, 16))
@hsettings(max_examples=60, deadline=None)
def test_batches_cover_every_item_once_within_budget(lengths, max_tokens, max_batch):
    batches = inference.length_sorted_batches(lengths, max_tokens=max_tokens, max_batch=max_batch)
    seen = np.concatenate(batches) if batches else np.array([], dtype=int)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= max_batch
        longest = max(lengths[i] for i in batch)
        assert len(batch) == 1 or longest * len(batch) <= max_tokens
    # longest first: each batch's longest item is no longer than the previous batch's shortest
    for prev, cur in zip(batches, batches[1:]):
        assert max(lengths[i] for i in cur) <= min(lengths[i] for i in prev)


def test_encode_is_batch_invariant_and_in_input_order(tiny_model_dirs):
    bi = load_bi_encoder(tiny_model_dirs[0])
    together = inference.encode(bi, TEXTS, max_tokens=64)  # several batches
    alone = np.stack([inference.encode(bi, t) for t in TEXTS])
    assert together.shape == (len(TEXTS), bi.dim) == (5, 16)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    assert inference.encode(bi, []).shape == (0, 16)


def test_score_pairs_probabilities(tiny_model_dirs):
    cross = load_cross_encoder(tiny_model_dirs[1])
    probs = labelling.score_pairs(cross, TEXTS, TEXTS[::-1], max_tokens=100)
    assert probs.shape == (5, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    one = labelling.score_pairs(cross, TEXTS[1:2], TEXTS[::-1][1:2])
    np.testing.assert_allclose(one[0], probs[1], atol=1e-5)
    with pytest.raises(ValueError, match="2 queries but 1 candidates"):
        labelling.score_pairs(cross, TEXTS[:2], TEXTS[:1])


def test_temperature_flattens_probabilities(tiny_model_dirs):
    cross = load_cross_encoder(tiny_model_dirs[1])
    sharp = labelling.score_pairs(cross, TEXTS, TEXTS)
    cross.temperature = 100.0
    flat = labelling.score_pairs(cross, TEXTS, TEXTS)
    assert (flat.max(1) <= sharp.max(1) + 1e-6).all()
    np.testing.assert_allclose(flat, 1 / 3, atol=0.02)


def test_unknown_precision_is_refused(tiny_model_dirs):
    bi = load_bi_encoder(tiny_model_dirs[0])
    with pytest.raises(ValueError, match="precision must be one of"):
        inference.encode(bi, TEXTS, precision="int3")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_linear_layer_gives_a_row_the_same_bits_however_many_rows_it_is_given(threads):
    import torch

    from mgeo_index.runtime import rows

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        layer = rows.Linear(256, 768)
        x = torch.randn(64, 256)
        with torch.inference_mode():
            full = layer(x)
            for m in range(1, 20):
                assert torch.equal(layer(x[:m]), full[:m]), m
            assert torch.equal(layer(x[:6].reshape(2, 3, 256)), full[:6].reshape(2, 3, 768))  # any leading shape
            assert layer(x[:0]).shape == (0, 768)
    finally:
        torch.set_num_threads(saved)


def test_the_shipped_network_scores_a_pair_alone_with_the_bits_it_has_in_a_batch():
    from mgeo_index import settings

    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    first = ["北京朝阳建国路88号", "深圳南山中山路75号", "上海徐汇漕溪北路1号", "杭州西湖文三路478号", "广州天河体育西路1号"]
    second = ["北京市朝阳区建国路88号", "深圳市南山区中山路75号东方科技园", "上海市徐汇区漕溪北路1号", "杭州市西湖区文三路",
              "广州市天河区体育西路1号2栋"]
    together = inference.network_logits(cross, first * 4, second * 4)
    for i in range(len(first)):
        assert np.array_equal(inference.network_logits(cross, first[i:i + 1], second[i:i + 1])[0], together[i])
        assert np.array_equal(inference.network_logits(cross, first[: i + 1], second[: i + 1]), together[: i + 1])
