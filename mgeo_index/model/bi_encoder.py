"""Bi-encoder (one tower per address): transformer → pooling → optional projection.

Stored in Hugging Face format (config.json, model.safetensors, tokenizer files) plus the
mgeo-index manifest (pooling, projection, max length) and ``projection.safetensors`` when a
projection layer is used. Any BERT-style checkpoint loads with mean pooling and no projection.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mgeo_index.model import bert
from mgeo_index.runtime import rows
from mgeo_index.model.manifest import check_savable, fingerprint, read_bi_manifest, save_hf_model, write_manifest
from mgeo_index.model.tokenizer import load_tokenizer

KIND = "bi-encoder"


class BiEncoder(nn.Module):
    def __init__(
        self,
        encoder: nn.Module,
        tokenizer,
        *,
        pooling: str = "mean",
        projection_dim: int | None = None,
        max_length: int = 64,
    ):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', not {pooling!r}")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_length = max_length
        hidden = encoder.config.hidden_size
        self.projection = rows.Linear(hidden, projection_dim) if projection_dim else None
        self.fingerprint = ""
        self.path: str | None = None  # where it was loaded from or saved to

    @property
    def dim(self) -> int:
        return self.projection.out_features if self.projection is not None else self.encoder.config.hidden_size

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        # input_ids: (B, T) → embeddings (B, D), not yet normalized
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, H)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        if self.projection is not None:
            pooled = self.projection(pooled)
        return pooled

    def save(self, path: str | Path, *, half: bool = True) -> None:
        """Write the Hugging Face files + manifest; ``half`` stores weights as FP16 (half the size)."""
        check_savable(self)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_hf_model(self.encoder, self.tokenizer, path, half=half)
        if self.projection is not None:
            state = {k: v.detach().to(torch.float16 if half else torch.float32).contiguous()
                     for k, v in self.projection.state_dict().items()}
            save_file(state, path / "projection.safetensors")
        write_manifest(
            path,
            {
                "kind": KIND,
                "pooling": self.pooling,
                "projection_dim": self.projection.out_features if self.projection is not None else None,
                "max_length": self.max_length,
            },
        )
        self.fingerprint = fingerprint(path)
        self.path = str(path.resolve())


def load_bi_encoder(path: str | Path, *, trainable: bool = False) -> BiEncoder:
    """Load a bi-encoder directory; ``trainable``: its transformer as a ``transformers`` model, to train it
    (otherwise a BERT runs as :mod:`mgeo_index.model.bert`'s plain modules: the same outputs, a faster start)."""
    path = Path(path)
    spec = read_bi_manifest(path)
    model = BiEncoder(bert.load_network(path, classifier=False, trainable=trainable), load_tokenizer(path),
                      pooling=spec["pooling"], projection_dim=spec["projection_dim"], max_length=spec["max_length"])
    if model.projection is not None:
        state = {k: v.float() for k, v in load_file(path / "projection.safetensors").items()}
        model.projection.load_state_dict(state)
    model.fingerprint = fingerprint(path)
    model.path = str(path.resolve())
    return model.eval()
