"""Gradient-boosted trees evaluated in NumPy: the group head's LightGBM boosters.

LightGBM trains the trees (the ``train`` extra); predicting needs only their splits and leaves, so ``match``
runs without LightGBM (and SciPy, which it requires). :meth:`Forest.from_texts` reads boosters' model texts
(``Booster.model_to_string()``), :meth:`Forest.save` / :meth:`Forest.load` keep their trees as arrays in one
safetensors file (:data:`STORED`: LightGBM's own numbering). For the walk a :class:`Forest` lays every tree out
flat: per node the input it reads, its threshold and its two children (a leaf is a node whose children are itself,
so a walk of a fixed number of steps ends on it). :meth:`Forest.raw_scores` walks a block of rows through a block
of trees of alike depth at a time (both small enough for the core's caches) and sums each class's leaves in tree
order, in float64, as LightGBM's ``predict(raw_score=True)`` does: the same scores to the last bit (tested). On
the shipped group head (6 boosters of 900 trees, up to 28 deep) and 5,000 CCKS pairs, 2-core EPYC: 1.5 s on two
threads, LightGBM 1.4 s.

The decision is LightGBM's for numerical splits: left where the value is at most the threshold. A float32 value
compares with a float64 threshold as it does with that threshold rounded down to float32, so the thresholds are
kept as float32. A missing value (NaN) is read as 0, LightGBM's rule for splits without a missing-value
direction; splits on categories or with a missing-value direction are refused (the group head trains neither).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The trees as LightGBM numbers them, every booster's one after another: per tree its leaves; per split (a tree's
# in its order) the input it reads, its threshold and its children (>= 0 a split, ~i leaf i); per leaf its value.
STORED = {"num_leaves": np.int32, "split_feature": np.int32, "threshold": np.float64, "left_child": np.int32,
          "right_child": np.int32, "leaf_value": np.float64}
ROWS = 256  # rows walked together: their features (float32) stay in the core's cache
TREES = 256  # trees walked together (256 × 256 the fastest tried of 64-1,024 rows × 128-2,048 trees, 2-core EPYC)
_MISSING_NONE, _CATEGORICAL = 0, 1


class ForestError(ValueError):
    """Trees, or inputs, this evaluator does not read (named in the message)."""


@dataclass(frozen=True)
class Forest:
    """Every booster's trees. Node n is addressed as 2n, and 2n + 1 is its right side: a walk's step from 2n reads
    ``feature[2n]`` and ``threshold[2n]``, adds 1 where the input exceeds the threshold, and goes to ``children``
    there (doubled too), so that it costs no multiplication."""

    feature: np.ndarray  # (2 · nodes,) int32: the input a node reads, twice (0 on leaves)
    threshold: np.ndarray  # (2 · nodes,) float32: right where the input exceeds it, twice (+inf on leaves)
    children: np.ndarray  # (2 · nodes,) int32: 2 · left child, 2 · right child (a leaf's are itself)
    value: np.ndarray  # (nodes,) float64: a leaf's value (0 on splits)
    roots: np.ndarray  # (trees,) int32: 2 · each tree's root
    depths: np.ndarray  # (trees,) int32: the longest path of each tree
    by_depth: np.ndarray  # (trees,) int64: each booster's trees, shallowest first (the walk's blocks)
    classes: int  # trees per boosting round: one per class
    boosters: int  # whose raw scores are averaged; each holds trees / boosters trees
    inputs: int
    stored: dict[str, np.ndarray]  # the trees as LightGBM numbers them (:data:`STORED`): what a file holds

    @classmethod
    def from_texts(cls, texts: list[str] | tuple[str, ...]) -> Forest:
        """The trees of one or more LightGBM model texts (``Booster.model_to_string()``), whose raw scores
        :meth:`raw_scores` averages; every booster must have the same classes, inputs and number of trees."""
        if not texts:
            raise ForestError("no boosters")
        read = [_read_booster(text) for text in texts]
        shapes = {(classes, inputs, len(fields["num_leaves"])) for classes, inputs, fields in read}
        if len(shapes) != 1:
            raise ForestError(f"the boosters differ in classes, inputs or trees: {sorted(shapes)}")
        classes, inputs, _ = shapes.pop()
        fields = {key: " ".join(v for *_, f in read for v in f[key] if v) for key in (*STORED, "decision_type")}
        number = {key: np.fromstring(fields[key], dtype=dtype, sep=" ") if fields[key] else np.zeros(0, dtype)
                  for key, dtype in (STORED | {"decision_type": np.int64}).items()}  # C's reading: exact, fast
        decision = number.pop("decision_type")
        if (decision & _CATEGORICAL).any() or (((decision >> 2) & 3) != _MISSING_NONE).any():
            raise ForestError("a tree splits on a category or has a missing-value direction; "
                              "this evaluator reads numerical splits only")
        return cls.from_stored(number, classes=classes, boosters=len(texts), inputs=inputs)

    @classmethod
    def from_stored(cls, stored: dict[str, np.ndarray], *, classes: int, boosters: int, inputs: int) -> Forest:
        """The forest of the arrays :data:`STORED` names, ``boosters`` boosters' trees one after another."""
        stored = {key: np.asarray(stored[key], dtype=dtype) for key, dtype in STORED.items()}
        leaves = stored["num_leaves"].astype(np.int64)
        splits = leaves - 1
        if len(stored["split_feature"]) != splits.sum() or len(stored["leaf_value"]) != leaves.sum():
            raise ForestError("the trees' splits or leaves do not add up to their num_leaves")
        if len(leaves) % (classes * boosters) or not len(leaves):
            raise ForestError(f"{len(leaves)} trees are not whole rounds of {classes} classes in {boosters} boosters")
        if (stored["split_feature"] >= inputs).any():
            raise ForestError(f"a split reads an input beyond the {inputs} the trees take")
        sizes = splits + leaves
        if 2 * sizes.sum() > np.iinfo(np.int32).max:
            raise ForestError(f"{sizes.sum()} nodes are too many")
        roots = np.cumsum(sizes) - sizes
        # where each split and each leaf goes: a tree's splits in LightGBM's numbering, then its leaves
        split_at = _positions(roots, splits)
        leaf_at = _positions(roots + splits, leaves)
        tree_of_split = np.repeat(np.arange(len(leaves)), splits)
        child = {side: np.where(c >= 0, roots[tree_of_split] + c, (roots + splits)[tree_of_split] + ~c)
                 for side, c in (("left", stored["left_child"].astype(np.int64)),
                                 ("right", stored["right_child"].astype(np.int64)))}
        n = int(sizes.sum())
        feature, threshold = np.zeros(n, dtype=np.int32), np.full(n, np.inf)
        feature[split_at], threshold[split_at] = stored["split_feature"], stored["threshold"]
        value = np.zeros(n)
        value[leaf_at] = stored["leaf_value"]
        children = np.empty((n, 2), dtype=np.int64)
        children[split_at, 0], children[split_at, 1] = child["left"], child["right"]
        children[leaf_at] = leaf_at[:, None]  # a leaf goes nowhere
        depths = _tree_depths(n, split_at, child["left"], child["right"], roots)
        per = len(leaves) // boosters
        by_depth = np.concatenate([b * per + np.argsort(depths[b * per : (b + 1) * per], kind="stable")
                                   for b in range(boosters)])
        return cls(np.repeat(feature, 2), np.repeat(_rounded_down(threshold), 2),
                   (2 * children).reshape(-1).astype(np.int32), value, (2 * roots).astype(np.int32), depths, by_depth,
                   classes, boosters, inputs, stored)

    def save(self, path: str | Path) -> None:
        """The trees (:data:`STORED`) and their shape into one safetensors file."""
        from safetensors.numpy import save_file

        # the shape as an array, not as metadata: safetensors writes metadata in no fixed order, and the same trees
        # must give the same bytes (a model's fingerprint covers this file)
        shape = np.array([self.classes, self.boosters, self.inputs], dtype=np.int64)
        save_file({key: np.ascontiguousarray(v) for key, v in self.stored.items()} | {"shape": shape}, str(path))

    @classmethod
    def load(cls, path: str | Path) -> Forest:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            if not {*STORED, "shape"} <= set(f.keys()):
                raise ForestError(f"{path}: not a forest of trees (its arrays or shape are missing)")
            stored = {key: f.get_tensor(key) for key in STORED}
            classes, boosters, inputs = (int(n) for n in f.get_tensor("shape"))
        return cls.from_stored(stored, classes=classes, boosters=boosters, inputs=inputs)

    @property
    def trees(self) -> int:
        return len(self.roots)

    def raw_scores(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """(n, classes) float64: each booster's raw score (its trees' leaves summed per class, in order),
        averaged over the boosters."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.inputs:
            raise ForestError(f"the trees read {self.inputs} inputs, not {x.shape[1:]}")
        if np.isnan(x).any():
            x = np.where(np.isnan(x), np.float32(0), x)
        chunks = [x[start : start + ROWS] for start in range(0, len(x), ROWS)]
        if threads > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(min(threads, len(chunks))) as pool:  # NumPy's gathers release the GIL
                sums = list(pool.map(self._sums, chunks))
        else:
            sums = [self._sums(chunk) for chunk in chunks]
        per_booster = np.concatenate(sums) if sums else np.zeros((0, self.boosters, self.classes))
        return sum(per_booster[:, b] for b in range(self.boosters)) / self.boosters

    def _sums(self, x: np.ndarray) -> np.ndarray:
        """(rows, boosters, classes) float64: each booster's leaves summed per class, tree after tree (LightGBM's
        order). Trees are walked a block at a time, blocks of alike depth (:attr:`by_depth`: a walk takes as many
        steps as its deepest tree), into buffers made once (arrays of this size would otherwise be mapped afresh
        each time, and threads would queue for the mappings)."""
        flat = x.reshape(-1)
        first = (np.arange(len(x), dtype=np.int32) * np.int32(x.shape[1]))[:, None]
        per = self.trees // self.boosters
        node = np.empty((len(x), TREES), dtype=np.int32)
        at, right = np.empty_like(node), np.empty(node.shape, dtype=bool)
        read, limit = np.empty(node.shape, dtype=np.float32), np.empty(node.shape, dtype=np.float32)
        leaves = np.empty((len(x), per))
        out = np.empty((len(x), self.boosters, self.classes))
        for booster in range(self.boosters):
            order = self.by_depth[booster * per : (booster + 1) * per]
            for start in range(0, per, TREES):
                trees = order[start : start + TREES]
                step = [buffer[:, : len(trees)] for buffer in (node, at, read, limit, right)]
                self._walk(flat, first, trees, *step)
                leaves[:, trees - booster * per] = self.value[step[0] >> 1]
            out[:, booster] = np.cumsum(leaves.reshape(len(x), -1, self.classes), axis=1)[:, -1]
        return out

    def _walk(self, flat, first, trees, node, at, read, limit, right) -> None:
        """Walk every row (``flat``, its rows starting at ``first``) from the roots of ``trees`` down to their
        leaves, left in ``node``."""
        node[:] = self.roots[trees]
        for _ in range(int(self.depths[trees].max())):
            np.take(self.feature, node, out=at, mode="clip")  # "clip": no bounds checks (2x)
            np.add(at, first, out=at)
            np.take(flat, at, out=read, mode="clip")
            np.take(self.threshold, node, out=limit, mode="clip")
            np.greater(read, limit, out=right)
            np.add(node, right, out=node)
            np.take(self.children, node, out=node, mode="clip")


def _rounded_down(threshold: np.ndarray) -> np.ndarray:
    """Each float64 threshold as the largest float32 at most it: a float32 input exceeds one exactly when it
    exceeds the other."""
    with np.errstate(over="ignore"):
        narrow = threshold.astype(np.float32)
    above = narrow.astype(np.float64) > threshold
    narrow[above] = np.nextafter(narrow[above], np.float32(-np.inf))
    return narrow


def _positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[i], starts[i] + 1, …, starts[i] + counts[i] - 1, for each i in turn."""
    return np.repeat(starts, counts) + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _tree_depths(n: int, split_at: np.ndarray, left: np.ndarray, right: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Each tree's longest path: a child's depth is its parent's plus one, settled a level per pass."""
    depth = np.zeros(n, dtype=np.int64)
    while True:
        below = depth[split_at] + 1
        if np.array_equal(depth[left], below) and np.array_equal(depth[right], below):
            return np.maximum.reduceat(depth, roots).astype(np.int32)
        depth[left], depth[right] = below, below


def _fields(block: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in block.splitlines() if "=" in line)


def _read_booster(text: str) -> tuple[int, int, dict[str, list[str]]]:
    """(classes, inputs, per tree field the tree's values as written) of one LightGBM model text."""
    head, _, body = text.partition("\nTree=")
    header = _fields(head)
    if not body or "num_tree_per_iteration" not in header:
        raise ForestError("not a LightGBM model text (no trees)")
    if "average_output" in head.split():
        raise ForestError("a random forest (average_output) is not a boosted model")
    classes, inputs = int(header["num_tree_per_iteration"]), int(header["max_feature_idx"]) + 1
    trees = [_fields(block) for block in ("Tree=" + body).split("end of trees")[0].split("\nTree=") if block.strip()]
    if len(trees) % classes:
        raise ForestError(f"{len(trees)} trees are not whole rounds of {classes}")
    return classes, inputs, {key: [tree.get(key, "") for tree in trees] for key in (*STORED, "decision_type")}
