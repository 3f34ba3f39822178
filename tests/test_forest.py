"""Boosted trees evaluated in NumPy (mgeo_index.model.forest): LightGBM's raw scores to the last bit, without
LightGBM."""
import numpy as np
import pytest

from mgeo_index.model.forest import Forest, ForestError


def _stump(threshold: float, left: float, right: float, inputs: int = 2) -> Forest:
    """One booster, one class, one tree: input 0 at most ``threshold`` → ``left``, else ``right``."""
    stored = {"num_leaves": [2], "split_feature": [0], "threshold": [threshold], "left_child": [~0],
              "right_child": [~1], "leaf_value": [left, right]}
    return Forest.from_stored(stored, classes=1, boosters=1, inputs=inputs)


def test_a_split_goes_left_at_its_threshold_and_right_above_it_as_a_float32_input_compares_in_float64():
    forest = _stump(0.1, -1.0, 1.0)
    x = np.array([[0.0, 5], [np.float32(0.1), 5], [0.09999999, 5], [np.nan, 5], [np.inf, 5], [-np.inf, 5]],
                 dtype=np.float32)
    # float32(0.1) is 0.100000001… > 0.1; NaN reads as 0 (LightGBM's rule without a missing-value direction)
    assert forest.raw_scores(x)[:, 0].tolist() == [-1.0, 1.0, -1.0, -1.0, 1.0, -1.0]
    exact = _stump(0.5, -1.0, 1.0)  # a threshold float32 holds exactly
    assert exact.raw_scores(np.array([[0.5, 0], [np.nextafter(np.float32(0.5), np.float32(1)), 0]],
                                     dtype=np.float32))[:, 0].tolist() == [-1.0, 1.0]


def test_leaves_sum_per_class_in_tree_order_and_boosters_average():
    # two boosters of two rounds of two classes; each tree a single leaf except the first
    stored = {"num_leaves": [2, 1, 1, 1] * 2, "split_feature": [1, 1], "threshold": [0.0, 0.0],
              "left_child": [~0, ~0], "right_child": [~1, ~1],
              "leaf_value": [1.0, 2.0, 10.0, 100.0, 1000.0] + [3.0, 4.0, 30.0, 300.0, 3000.0]}
    forest = Forest.from_stored(stored, classes=2, boosters=2, inputs=2)
    scores = forest.raw_scores(np.array([[0, -1], [0, 1]], dtype=np.float32))
    # booster 1: class 0 = leaf(1 or 2) + 100, class 1 = 10 + 1000; booster 2 the same with 3/4, 300, 30, 3000
    assert scores.tolist() == [[(101 + 303) / 2, (1010 + 3030) / 2], [(102 + 304) / 2, (1010 + 3030) / 2]]
    assert forest.depths.tolist() == [1, 0, 0, 0] * 2


def test_refuses_what_it_does_not_read():
    with pytest.raises(ForestError, match="inputs"):
        _stump(0.0, 0, 1, inputs=2).raw_scores(np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(ForestError, match="num_leaves"):
        Forest.from_stored({"num_leaves": [3], "split_feature": [0], "threshold": [0.0], "left_child": [~0],
                            "right_child": [~1], "leaf_value": [0.0, 1.0]}, classes=1, boosters=1, inputs=1)
    with pytest.raises(ForestError, match="beyond"):
        _stump(0.0, 0, 1, inputs=0)
    with pytest.raises(ForestError, match="LightGBM model text"):
        Forest.from_texts(["version=v4\n"])


def test_a_saved_forest_is_the_same_bytes_each_time_and_loads_back(tmp_path):
    forest = _stump(0.25, -2.0, 3.0, inputs=4)
    forest.save(tmp_path / "a.safetensors")
    forest.save(tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    again = Forest.load(tmp_path / "a.safetensors")
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    assert np.array_equal(again.raw_scores(x), forest.raw_scores(x)) and again.inputs == 4
    (tmp_path / "c.safetensors").write_bytes(b"not a forest")
    with pytest.raises(Exception):
        Forest.load(tmp_path / "c.safetensors")


@pytest.mark.parametrize("leaves,rows,boosters", [(63, 700, 3), (7, 40, 1), (255, 300, 2)])
def test_lightgbms_own_raw_scores_to_the_last_bit(leaves, rows, boosters):
    lgb = pytest.importorskip("lightgbm")
    rng = np.random.default_rng(leaves)
    x = rng.normal(size=(2000, 12)).astype(np.float32)
    x[:, 3] = np.round(x[:, 3])  # ties at thresholds
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int) + (x[:, 4] > 1.2)
    y[rng.random(len(y)) < 0.05] = 2
    texts = []
    for seed in range(boosters):
        params = {"objective": "multiclass", "num_class": 3, "num_leaves": leaves, "min_data_in_leaf": 5,
                  "learning_rate": 0.2, "feature_fraction": 0.7, "seed": seed, "verbose": -1, "num_threads": 1}
        texts.append(lgb.train(params, lgb.Dataset(x, y), num_boost_round=12).model_to_string())
    forest = Forest.from_texts(texts)
    test = rng.normal(size=(rows, 12)).astype(np.float32)
    test[::5, 3] = np.round(test[::5, 3])
    test[::11, 0] = np.nan
    reference = sum(np.asarray(lgb.Booster(model_str=t).predict(test, raw_score=True), dtype=np.float64)
                    for t in texts) / boosters
    assert np.array_equal(forest.raw_scores(test), reference)
    assert np.array_equal(forest.raw_scores(test, threads=2), reference)  # row blocks on threads: the same bits
    assert forest.trees == 12 * 3 * boosters


def test_single_leaf_trees_and_a_category_split():
    lgb = pytest.importorskip("lightgbm")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    y = np.where(x[:, 0] > 0, 0, 1)
    y[:3] = 2
    for least in (20, 250):  # at 250 of 400 rows in a leaf, no split is possible: every tree is one leaf
        booster = lgb.train({"objective": "multiclass", "num_class": 3, "min_data_in_leaf": least, "verbose": -1},
                            lgb.Dataset(x, y), num_boost_round=6)
        forest = Forest.from_texts([booster.model_to_string()])
        assert (forest.depths == 0).all() == (least == 250)
        assert np.array_equal(forest.raw_scores(x), booster.predict(x, raw_score=True))
    categories = np.column_stack([rng.integers(0, 5, 400), x[:, 1]]).astype(np.float32)
    by_category = lgb.train({"objective": "binary", "verbose": -1, "min_data_in_leaf": 5, "min_data_per_group": 5,
                             "cat_smooth": 1}, lgb.Dataset(categories, (categories[:, 0] == 2).astype(int),
                                                           categorical_feature=[0]), num_boost_round=3)
    with pytest.raises(ForestError, match="category"):
        Forest.from_texts([by_category.model_to_string()])
