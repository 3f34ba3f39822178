"""Character-level address element tagger: embedding → residual trigram convolution → BiLSTM → CRF.

Tags are BIO over element labels (prov, city, district, town, community, road, roadno, poi,
subpoi, houseno, cellno, floorno, roomno, redundant, …). Illegal BIO transitions (O → I-x,
B-x → I-y) are forbidden in the CRF, so every decoded path is a well-formed list of spans.
The shipped model lives in ``mgeo_index/text/tagger/`` (``model.safetensors`` + ``tagger.json``
with the vocabulary, labels and sizes); ``scripts/train_tagger.py`` makes it.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mgeo_index.heap import freeze_loaded

DEFAULT_DIR = Path(__file__).parent / "tagger"
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


class Tagger(nn.Module):
    def __init__(self, cfg: TaggerConfig):
        super().__init__()
        self.cfg = cfg
        self.char_ids = {c: i + 2 for i, c in enumerate(cfg.chars)}
        self.tags = cfg.tags  # computed once: tag() looks one up per character
        n = len(self.tags)
        self.embed = nn.Embedding(len(cfg.chars) + 2, cfg.dim, padding_idx=PAD)
        self.conv = nn.Conv1d(cfg.dim, cfg.dim, 3, padding=1)
        self.lstm = nn.LSTM(cfg.dim, cfg.hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(2 * cfg.hidden, n)
        self.transitions = nn.Parameter(torch.zeros(n, n))  # [from, to]
        self.start = nn.Parameter(torch.zeros(n))
        self.end = nn.Parameter(torch.zeros(n))
        self.register_buffer("allowed", _allowed_transitions(self.tags), persistent=False)
        self.register_buffer("can_start", torch.tensor([not t.startswith("I-") for t in self.tags]), persistent=False)

    # ---- inputs -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, T], mask [B, T]) for texts cut to max_length."""
        texts = [t[: self.cfg.max_length] for t in texts]
        width = max(max((len(t) for t in texts), default=1), 1)
        get = self.char_ids.get
        rows = [[get(c, UNK) for c in t] + [PAD] * (width - len(t)) for t in texts]  # one tensor, not one per row
        ids = torch.tensor(rows, dtype=torch.long)
        return ids, ids != PAD

    # ---- network ------------------------------------------------------------------------------
    def emissions(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # B, T, C
        if torch.is_grad_enabled():
            x = x + torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        else:
            x = x + torch.relu(self._folded_conv(ids))
        if bool(mask.all()):  # rows of one length: nothing to pack (the parser batches them so: 1.6x faster)
            h, _ = self.lstm(self.drop(x))
            return self.out(self.drop(h))
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.drop(x), lengths, batch_first=True, enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=ids.shape[1])
        return self.out(self.drop(h))  # B, T, tags

    def _folded_conv(self, ids: torch.Tensor) -> torch.Tensor:
        """The convolution over the embedding without the convolution: it is linear in the characters, so its
        three taps are three tables (character → the tap's output, ``embed @ conv.weight[:, :, k].T``) and each
        position's output is three table rows added, the neighbours' rows shifted in (the padding id's row is
        zero, as the zero padding it stands for). The same sums in another order (at most ~1e-5 apart); on
        this AVX2 CPU it cut the embedding and convolution from 0.19 to 0.08 CPU s per 3,000 addresses.
        The tables are made again whenever a weight has changed (its in-place version counter moved; weights
        made under ``torch.inference_mode()`` have no counter, and cannot be trained)."""
        key = tuple((p.data_ptr(), None if p.is_inference() else p._version)
                    for p in (self.embed.weight, self.conv.weight, self.conv.bias))
        if getattr(self, "_taps_key", None) != key:
            weight = self.conv.weight.detach()  # out, in, 3
            self._taps = torch.stack([self.embed.weight.detach() @ weight[:, :, k].T for k in range(3)])
            self._taps_key = key
        before, here, after = self._taps
        out = here[ids] + self.conv.bias.detach()
        out[:, 1:] += before[ids[:, :-1]]
        out[:, :-1] += after[ids[:, 1:]]
        return out

    def _trans(self) -> torch.Tensor:
        return self.transitions.masked_fill(~self.allowed, FORBIDDEN)

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        """Mean CRF negative log-likelihood of the gold tag paths."""
        emis = self.emissions(ids, mask)
        trans, start, end = self._trans(), self.start.masked_fill(~self.can_start, FORBIDDEN), self.end
        B, T, _ = emis.shape
        rows = torch.arange(B)
        gold = start[tags[:, 0]] + emis[rows, 0, tags[:, 0]]
        alpha = start + emis[:, 0]
        for t in range(1, T):
            m = mask[:, t]
            step = trans[tags[:, t - 1], tags[:, t]] + emis[rows, t, tags[:, t]]
            gold = gold + step * m
            nxt = torch.logsumexp(alpha.unsqueeze(2) + trans + emis[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(m.unsqueeze(1), nxt, alpha)
        last = tags[rows, mask.sum(1) - 1]
        gold = gold + end[last]
        log_z = torch.logsumexp(alpha + end, dim=1)
        return (log_z - gold).mean()

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """Best tag path per row (Viterbi), each as long as its text.

        The forward pass keeps only the best scores ([time, tag, row]) and uses the transitions' structure:
        ``O`` and every ``B-x`` may follow any tag, so their best predecessor is a max over all tags; ``I-x``
        may follow only ``B-x`` or ``I-x``, so its best is the larger of those two. The backward pass
        recomputes each chosen tag's predecessor from the kept scores, the first of equal ones as a max over
        all tags with the forbidden ones at FORBIDDEN gives. The same paths as the full max over every
        (from, to) pair (tested). It runs in NumPy (per step a few small array operations, whose call overhead
        in torch was a quarter of decoding) on the tags reordered ``O, B-…, I-…`` so each kind is one slice,
        except the step's one large operation, the [from, to, row] sums and their max over ``from``, which torch
        does in half NumPy's time on the same memory (the same float32 sums and maxima, so the same paths)."""
        trans = self._trans().numpy()
        n = trans.shape[0]
        order = np.array([0, *range(1, n, 2), *range(2, n, 2)])  # O, the B- tags (any predecessor), the I- tags
        k = (n + 1) // 2  # O and the B- tags
        steps = np.ascontiguousarray(self.emissions(ids, mask).numpy().transpose(1, 2, 0)[:, order])  # [time, tag, row]
        trans = np.ascontiguousarray(trans[np.ix_(order, order)])
        to_free = torch.from_numpy(np.ascontiguousarray(trans[:, :k])[:, :, None])  # [from, to, 1]
        enter = trans[np.arange(1, k), np.arange(k, n)][:, None]  # B-x → I-x
        stay = trans[np.arange(k, n), np.arange(k, n)][:, None]  # I-x → I-x
        active = mask.numpy()
        ragged = not active.all()
        kept = np.empty_like(steps)
        kept[0] = self.start.masked_fill(~self.can_start, FORBIDDEN).numpy()[order][:, None] + steps[0]
        kept_t = torch.from_numpy(kept)  # the same memory
        sums = torch.empty((n, k, steps.shape[2]))
        for t in range(1, len(steps)):
            score, new = kept[t - 1], kept[t]
            torch.add(kept_t[t - 1][:, None, :], to_free, out=sums)
            torch.amax(sums, 0, out=kept_t[t][:k])
            new[:k] += steps[t, :k]
            np.maximum(score[1:k] + enter, score[k:] + stay, out=new[k:])
            new[k:] += steps[t, k:]
            if ragged:  # past a row's end its scores stay
                ended = ~active[:, t]
                new[:, ended] = score[:, ended]
        lengths = active.sum(1)
        last = (kept[-1] + self.end.numpy()[order][:, None]).argmax(axis=0)
        path = [last]
        for t in range(len(steps) - 1, 0, -1):
            previous = (kept[t - 1] + trans[:, last]).argmax(axis=0)
            last = np.where(lengths > t, previous, last)  # past a row's end its tag stays
            path.append(last)
        tags = order[np.stack(path[::-1], axis=1)].tolist()  # back to the tags' own indices
        return [row[:length] for row, length in zip(tags, lengths.tolist())]

    def tag(self, texts: Sequence[str]) -> list[list[tuple[str, int, int]]]:
        """Spans (label, start, end) per text; one network pass for the whole list."""
        if not texts:
            return []
        ids, mask = self.encode(texts)
        label_of = [None if tag == "O" else tag[2:] for tag in self.tags]
        inside = [tag.startswith("I-") for tag in self.tags]
        return [_spans_of_path(row, label_of, inside) for row in self.decode(ids, mask)]

    # ---- files --------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"))
        (directory / "tagger.json").write_text(json.dumps(asdict(self.cfg), ensure_ascii=False))


def _allowed_transitions(tags: list[str]) -> torch.Tensor:
    """allowed[i, j]: tag j may follow tag i (I-x only after B-x or I-x)."""
    n = len(tags)
    allowed = torch.ones(n, n, dtype=torch.bool)
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


def load_tagger(directory: Path | str | None = None) -> Tagger:
    directory = Path(directory) if directory else DEFAULT_DIR
    if not (directory / "tagger.json").exists():
        raise FileNotFoundError(f"no tagger in {directory}: train one with scripts/train_tagger.py")
    cfg = TaggerConfig(**json.loads((directory / "tagger.json").read_text()))
    model = Tagger(cfg)
    state = {k: v.float() for k, v in load_file(str(directory / "model.safetensors")).items()}
    model.load_state_dict(state)
    return model.eval()


@lru_cache(maxsize=1)
def default_tagger() -> Tagger:
    """The shipped tagger, in FP32: each address is tagged the same whatever it is batched with. (The int8
    dynamic quantization used before scaled activations per batch: 12 of 2,000 addresses were tagged otherwise
    alone than in a batch of 128, so a query's parse, and its pair features, moved with its batch-mates. FP32
    costs 0.85 CPU s per 3,000 addresses on the network part against int8's 0.68.) Loaded once per process and
    kept out of the garbage collector's scans (:func:`mgeo_index.heap.freeze_loaded`), with torch's own objects."""
    tagger = load_tagger(DEFAULT_DIR)
    freeze_loaded()
    return tagger
