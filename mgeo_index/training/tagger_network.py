"""The address element tagger as a trainable torch network: embedding → residual trigram convolution → BiLSTM →
CRF (:mod:`mgeo_index.text.tagger` describes the tags). Training (``scripts/train_tagger.py``) fits it and saves
it in the layout :func:`mgeo_index.text.tagger.load_tagger` reads; tagging runs in NumPy, without torch."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mgeo_index.text.tagger import (
    CONFIG, FORBIDDEN, PAD, WEIGHTS, Tagger, TaggerConfig, allowed_transitions, best_paths, encode, read_config,
    spans_of_paths,
)


class TaggerNetwork(nn.Module):
    """The tagger as a trainable torch network (CRF loss); the parser tags with its NumPy twin (:meth:`tagger`)."""

    def __init__(self, cfg: TaggerConfig):
        super().__init__()
        self.cfg = cfg
        self.char_ids = cfg.char_ids
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
        self.register_buffer("allowed", torch.from_numpy(allowed_transitions(self.tags)), persistent=False)
        self.register_buffer("can_start", torch.tensor([not t.startswith("I-") for t in self.tags]), persistent=False)

    # ---- inputs -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, T], mask [B, T]) for texts cut to max_length (:func:`mgeo_index.text.tagger.encode`)."""
        ids, mask = encode(texts, self.char_ids, self.cfg.max_length)
        return torch.from_numpy(ids), torch.from_numpy(mask)

    # ---- network ------------------------------------------------------------------------------
    def emissions(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # B, T, C
        x = x + torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        if bool(mask.all()):  # rows of one length: nothing to pack (the parser batches them so: 1.6x faster)
            h, _ = self.lstm(self.drop(x))
            return self.out(self.drop(h))
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.drop(x), lengths, batch_first=True, enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=ids.shape[1])
        return self.out(self.drop(h))  # B, T, tags

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
        """Best tag path per row (:func:`~mgeo_index.text.tagger.best_paths`), each as long as its text."""
        start = self.start.masked_fill(~self.can_start, FORBIDDEN)
        return best_paths(self.emissions(ids, mask).float().numpy(), mask.numpy(), self._trans().numpy(),
                          start.numpy(), self.end.numpy())

    def tag(self, texts: Sequence[str]) -> list[list[tuple[str, int, int]]]:
        """Spans (label, start, end) per text, from this network's own emissions."""
        if not texts:
            return []
        return spans_of_paths(self.decode(*self.encode(texts)), self.tags)

    def tagger(self) -> Tagger:
        """This network's weights as the NumPy :class:`~mgeo_index.text.tagger.Tagger` the parser tags with."""
        return Tagger(self.cfg, {k: v.detach().float().numpy() for k, v in self.state_dict().items()})

    # ---- files --------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS))
        (directory / CONFIG).write_text(json.dumps(asdict(self.cfg), ensure_ascii=False))


def load_network(directory: Path | str) -> TaggerNetwork:
    """A saved tagger as its trainable network (to train it further, or to teach another)."""
    directory = Path(directory)
    model = TaggerNetwork(read_config(directory))
    model.load_state_dict({k: v.float() for k, v in load_file(str(directory / WEIGHTS)).items()})
    return model.eval()
