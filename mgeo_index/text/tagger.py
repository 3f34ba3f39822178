"""Character-level address element tagger: embedding → residual trigram convolution → BiLSTM → CRF.

Tags are BIO over element labels (prov, city, district, town, community, road, roadno, poi,
subpoi, houseno, cellno, floorno, roomno, redundant, …). Illegal BIO transitions (O → I-x,
B-x → I-y) are forbidden in the CRF, so every decoded path is a well-formed list of spans.
The shipped model lives in ``mgeo_index/text/tagger/`` (``model.safetensors`` + ``tagger.json``
with the vocabulary, labels and sizes); ``scripts/train_tagger.py`` makes it.

Tagging runs in NumPy (:class:`Tagger`): parsing an address imports no torch, so a one-shot ``parse`` or
``resolve`` starts without it. The trainable network is :class:`mgeo_index.training.tagger_network.TaggerNetwork`
(torch); both decode with :func:`best_paths`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from mgeo_index.heap import freeze_loaded

DEFAULT_DIR = Path(__file__).parent / "tagger"
WEIGHTS = "model.safetensors"
CONFIG = "tagger.json"

PAD, UNK = 0, 1
FORBIDDEN = -1e4


@dataclass
class TaggerConfig:
    chars: list[str]  # id 2 + i ↔ chars[i]; 0 = padding, 1 = unknown
    labels: list[str]  # element labels; tags are "O", then B-x / I-x per label
    dim: int = 128
    hidden: int = 128
    dropout: float = 0.2
    max_length: int = 128
    metrics: dict = field(default_factory=dict)

    @property
    def tags(self) -> list[str]:
        return ["O"] + [f"{p}-{label}" for label in self.labels for p in "BI"]

    @property
    def char_ids(self) -> dict[str, int]:
        """Character → input id (after PAD and UNK)."""
        return {c: i + 2 for i, c in enumerate(self.chars)}


class Tagger:
    """The tagger's inference in NumPy, FP32: each address is tagged the same whatever it is batched with (every
    row's sums are its own). ``state``: the network's weights by their torch names
    (:class:`~mgeo_index.training.tagger_network.TaggerNetwork`'s ``state_dict``)."""

    def __init__(self, cfg: TaggerConfig, state: dict[str, np.ndarray]):
        self.cfg = cfg
        self.char_ids = cfg.char_ids
        self.tags = cfg.tags  # computed once: tag() looks one up per character
        w = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in state.items()}
        conv = w["conv.weight"]  # out, in, 3
        # the convolution is linear in the characters: its three taps are three tables (character → the tap's
        # output); each position's output is three rows added, the neighbours' shifted in (padding's row is zero)
        self.taps = np.stack([w["embed.weight"] @ conv[:, :, k].T for k in range(3)])
        self.embed, self.conv_bias = w["embed.weight"], w["conv.bias"]
        # each direction's gates reordered i, f, o, g (torch's i, f, g, o): the three sigmoids are one slice
        gates = np.concatenate([np.arange(0, 2 * cfg.hidden), np.arange(3 * cfg.hidden, 4 * cfg.hidden),
                                np.arange(2 * cfg.hidden, 3 * cfg.hidden)])
        self.lstm = [(w[f"lstm.weight_ih_l0{s}"][gates].T.copy(),
                      (w[f"lstm.bias_ih_l0{s}"] + w[f"lstm.bias_hh_l0{s}"])[gates],
                      w[f"lstm.weight_hh_l0{s}"][gates].T.copy()) for s in ("", "_reverse")]
        self.out_weight, self.out_bias = w["out.weight"].T.copy(), w["out.bias"]
        allowed = allowed_transitions(self.tags)
        self.transitions = np.where(allowed, w["transitions"], np.float32(FORBIDDEN)).astype(np.float32)
        can_start = np.array([not t.startswith("I-") for t in self.tags])
        self.start = np.where(can_start, w["start"], np.float32(FORBIDDEN)).astype(np.float32)
        self.end = w["end"]

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return encode(texts, self.char_ids, self.cfg.max_length)

    def emissions(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[B, T, tags] scores of each character's tags."""
        before, here, after = self.taps
        conv = here[ids] + self.conv_bias
        conv[:, 1:] += before[ids[:, :-1]]
        conv[:, :-1] += after[ids[:, 1:]]
        x = self.embed[ids] + np.maximum(conv, 0)
        forward = _lstm(x, *self.lstm[0])
        if mask.all():  # rows of one length (the parser batches them so)
            backward = _lstm(x[:, ::-1], *self.lstm[1])[:, ::-1]
        else:  # the backward direction reads each row from its own last character (what packing does)
            lengths, steps = mask.sum(1), np.arange(ids.shape[1])
            flip = np.where(steps[None, :] < lengths[:, None], lengths[:, None] - 1 - steps[None, :], steps[None, :])
            rows = np.arange(ids.shape[0])[:, None]
            backward = _lstm(x[rows, flip], *self.lstm[1])[rows, flip]
        hidden = np.concatenate([forward, backward], axis=2)
        return hidden @ self.out_weight + self.out_bias

    def decode(self, ids: np.ndarray, mask: np.ndarray) -> list[list[int]]:
        """Best tag path per row (:func:`best_paths`), each as long as its text."""
        return best_paths(self.emissions(ids, mask), mask, self.transitions, self.start, self.end)

    def tag(self, texts: Sequence[str]) -> list[list[tuple[str, int, int]]]:
        """Spans (label, start, end) per text; one network pass for the whole list."""
        if not texts:
            return []
        return spans_of_paths(self.decode(*self.encode(texts)), self.tags)


def encode(texts: Sequence[str], char_ids: dict[str, int], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, T], mask [B, T]) for texts cut to ``max_length``, padded with PAD; characters not in ``char_ids``
    are UNK."""
    texts = [t[:max_length] for t in texts]
    width = max(max((len(t) for t in texts), default=1), 1)
    get = char_ids.get
    ids = np.array([[get(c, UNK) for c in t] + [PAD] * (width - len(t)) for t in texts], dtype=np.int64)
    return ids, ids != PAD


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _lstm(x: np.ndarray, w_in: np.ndarray, bias: np.ndarray, w_hidden: np.ndarray) -> np.ndarray:
    """One direction of torch's LSTM (its gates reordered i, f, o, g) over [B, T, C] from zero states → [B, T, H]."""
    batch, steps, _ = x.shape
    width = w_hidden.shape[0]
    gates_in = x @ w_in + bias  # every step's input part in one product
    h = np.zeros((batch, width), dtype=np.float32)
    c = np.zeros((batch, width), dtype=np.float32)
    out = np.empty((batch, steps, width), dtype=np.float32)
    for t in range(steps):
        gates = gates_in[:, t] + h @ w_hidden
        sig = _sigmoid(gates[:, : 3 * width])
        c = sig[:, width : 2 * width] * c + sig[:, :width] * np.tanh(gates[:, 3 * width :])
        h = sig[:, 2 * width :] * np.tanh(c)
        out[:, t] = h
    return out


def best_paths(emissions: np.ndarray, mask: np.ndarray, transitions: np.ndarray, start: np.ndarray,
               end: np.ndarray) -> list[list[int]]:
    """Best tag path per row (Viterbi) of CRF scores, each as long as its row's ``mask``.

    ``emissions`` [B, T, tags]; ``transitions`` [from, to] with forbidden moves at FORBIDDEN, ``start`` likewise.
    The forward pass keeps only the best scores ([time, tag, row]) and uses the transitions' structure: ``O`` and
    every ``B-x`` may follow any tag, so their best predecessor is a max over all tags; ``I-x`` may follow only
    ``B-x`` or ``I-x``, so its best is the larger of those two. The backward pass recomputes each chosen tag's
    predecessor from the kept scores, the first of equal ones as a max over all tags gives. The same paths as the
    full max over every (from, to) pair (tested), on the tags reordered ``O, B-…, I-…`` so each kind is one slice."""
    trans = np.asarray(transitions, dtype=np.float32)
    n = trans.shape[0]
    order = np.array([0, *range(1, n, 2), *range(2, n, 2)])  # O, the B- tags (any predecessor), the I- tags
    k = (n + 1) // 2  # O and the B- tags
    steps = np.ascontiguousarray(np.asarray(emissions, dtype=np.float32).transpose(1, 2, 0)[:, order])  # [time, tag, row]
    trans = np.ascontiguousarray(trans[np.ix_(order, order)])
    to_free = np.ascontiguousarray(trans[:, :k])[:, :, None]  # [from, to, 1]
    enter = trans[np.arange(1, k), np.arange(k, n)][:, None]  # B-x → I-x
    stay = trans[np.arange(k, n), np.arange(k, n)][:, None]  # I-x → I-x
    active = np.asarray(mask, dtype=bool)
    ragged = not active.all()
    kept = np.empty_like(steps)
    kept[0] = np.asarray(start, dtype=np.float32)[order][:, None] + steps[0]
    sums = np.empty((n, k, steps.shape[2]), dtype=np.float32)
    for t in range(1, len(steps)):
        score, new = kept[t - 1], kept[t]
        np.add(score[:, None, :], to_free, out=sums)
        np.amax(sums, 0, out=new[:k])
        new[:k] += steps[t, :k]
        np.maximum(score[1:k] + enter, score[k:] + stay, out=new[k:])
        new[k:] += steps[t, k:]
        if ragged:  # past a row's end its scores stay
            ended = ~active[:, t]
            new[:, ended] = score[:, ended]
    lengths = active.sum(1)
    last = (kept[-1] + np.asarray(end, dtype=np.float32)[order][:, None]).argmax(axis=0)
    path = [last]
    for t in range(len(steps) - 1, 0, -1):
        previous = (kept[t - 1] + trans[:, last]).argmax(axis=0)
        last = np.where(lengths > t, previous, last)  # past a row's end its tag stays
        path.append(last)
    tags = order[np.stack(path[::-1], axis=1)].tolist()  # back to the tags' own indices
    return [row[:length] for row, length in zip(tags, lengths.tolist())]


def spans_of_paths(paths: Sequence[Sequence[int]], tags: Sequence[str]) -> list[list[tuple[str, int, int]]]:
    """Spans (label, start, end) of each path of tag indices."""
    label_of = [None if tag == "O" else tag[2:] for tag in tags]
    inside = [tag.startswith("I-") for tag in tags]
    return [_spans_of_path(row, label_of, inside) for row in paths]


def allowed_transitions(tags: list[str]) -> np.ndarray:
    """allowed[i, j]: tag j may follow tag i (I-x only after B-x or I-x)."""
    n = len(tags)
    allowed = np.ones((n, n), dtype=bool)
    for j, tag in enumerate(tags):
        if tag.startswith("I-"):
            for i, prev in enumerate(tags):
                allowed[i, j] = prev[2:] == tag[2:] and prev != "O"
    return allowed


def spans_from_tags(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """BIO tags → [(label, start, end)], end exclusive; a stray I-x opens a span."""
    return _spans_of_path(range(len(tags)), [None if t == "O" else t[2:] for t in tags], [t.startswith("I-") for t in tags])


def _spans_of_path(path: Sequence[int], label_of: Sequence[str | None], inside: Sequence[bool]) -> list[tuple[str, int, int]]:
    """:func:`spans_from_tags` of a path of tag indices (``label_of[i]``: tag i's label, None for O; ``inside[i]``:
    tag i is an I- tag), without building a string per character."""
    spans: list[tuple[str, int, int]] = []
    label, start = None, 0
    for i, tag in enumerate(path):
        if label is not None and inside[tag] and label_of[tag] == label:
            continue  # the open span goes on
        if label is not None:
            spans.append((label, start, i))
        label, start = label_of[tag], i
    if label is not None:
        spans.append((label, start, len(path)))
    return spans


def tags_from_spans(length: int, spans: Sequence[tuple[str, int, int]]) -> list[str]:
    tags = ["O"] * length
    for label, start, end in spans:
        tags[start] = f"B-{label}"
        for i in range(start + 1, end):
            tags[i] = f"I-{label}"
    return tags


def read_config(directory: Path | str) -> TaggerConfig:
    return TaggerConfig(**json.loads((Path(directory) / CONFIG).read_text()))


def load_tagger(directory: Path | str | None = None) -> Tagger:
    """The tagger saved in ``directory`` (default: the shipped one), for tagging."""
    from safetensors.numpy import load_file

    directory = Path(directory) if directory else DEFAULT_DIR
    if not (directory / CONFIG).exists():
        raise FileNotFoundError(f"no tagger in {directory}: train one with scripts/train_tagger.py")
    return Tagger(read_config(directory), load_file(str(directory / WEIGHTS)))


@lru_cache(maxsize=1)
def default_tagger() -> Tagger:
    """The shipped tagger, in FP32: each address is tagged the same whatever it is batched with. (The int8
    dynamic quantization used before scaled activations per batch: 12 of 2,000 addresses were tagged otherwise
    alone than in a batch of 128, so a query's parse, and its pair features, moved with its batch-mates.) Loaded
    once per process and kept out of the garbage collector's scans (:func:`mgeo_index.heap.freeze_loaded`, which
    also hands back what loading freed)."""
    tagger = load_tagger(DEFAULT_DIR)
    freeze_loaded()
    return tagger
