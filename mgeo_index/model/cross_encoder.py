"""Cross-encoder: (query, candidate) → exact_match / partial_match / not_match.

A Hugging Face sequence-classification checkpoint with three labels, plus a manifest holding
the maximum pair length and the calibration temperature fitted on a dev split.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from mgeo_index.model.manifest import save_tokenizer, ModelError, fingerprint, read_manifest, write_manifest
from mgeo_index.settings import LABELS

KIND = "cross-encoder"


class CrossEncoder(torch.nn.Module):
    def __init__(self, model, tokenizer, *, max_length: int = 128, temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.temperature = temperature
        self.labels = tuple(model.config.id2label[i] for i in range(model.config.num_labels))
        self.fingerprint = ""
        self.path: str | None = None  # where it was loaded from or saved to

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        # (B, T) → logits (B, 3) in LABELS order
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits

    def save(self, path: str | Path, *, half: bool = True) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model = self.model.half() if half else self.model
        model.save_pretrained(path)
        self.model.float()
        save_tokenizer(self.tokenizer, path)
        write_manifest(
            path, {"kind": KIND, "max_length": self.max_length, "temperature": self.temperature, "labels": list(self.labels)}
        )
        self.fingerprint = fingerprint(path)
        self.path = str(path.resolve())


def load_cross_encoder(path: str | Path) -> CrossEncoder:
    path = Path(path)
    manifest = read_manifest(path, KIND)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    labels = tuple(model.config.id2label[i] for i in range(model.config.num_labels))
    if set(labels) != set(LABELS):
        raise ModelError(
            f"{path}: cross-encoder labels are {labels}; expected the three labels {LABELS} "
            "(set id2label in config.json)."
        )
    cross = CrossEncoder(
        model,
        tokenizer,
        max_length=manifest.get("max_length", 128),
        temperature=float(manifest.get("temperature", 1.0)),
    )
    cross.fingerprint = fingerprint(path)
    cross.path = str(path.resolve())
    return cross.eval()
