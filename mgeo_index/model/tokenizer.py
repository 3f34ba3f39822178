"""Tokenizers: the character-level one built from address text, and the one door that reads a model's.

Every character is one token (Chinese addresses are short and character-compositional). The
tokenizer normalizes with NFKC + lowercase so full-width ``４７８Ａ`` and ``478a`` share tokens.
It is saved in Hugging Face format; :func:`load_tokenizer` reads ``tokenizer.json`` with the ``tokenizers``
library alone (:class:`FastTokenizer`: the batch call the encoders make, as ``transformers`` answers it),
and only a checkpoint without one goes through ``transformers``.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel

from mgeo_index.model.manifest import TOKENIZER_CONFIG, stated_limit

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOKENIZER_FILE = "tokenizer.json"


def build_char_tokenizer(
    texts: Iterable[str], *, min_freq: int = 2, max_vocab: int = 12000
):
    """Vocabulary = special tokens + characters seen at least ``min_freq`` times (most frequent first)."""
    import unicodedata

    from transformers import PreTrainedTokenizerFast

    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(unicodedata.normalize("NFKC", text).lower())
    chars = [c for c, n in counts.most_common() if n >= min_freq and not c.isspace()]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for char in chars[: max_vocab - len(SPECIAL_TOKENS)]:
        vocab.setdefault(char, len(vocab))

    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


class FastTokenizer:
    """A ``tokenizer.json`` behind the call the encoders make: ``tokenizer(first, second, padding=True,
    truncation=True, max_length=…, return_tensors="pt")`` gives what ``PreTrainedTokenizerFast`` gives (the same
    ids, pair truncation longest first, right padding with ``[PAD]``, type ids, attention mask)."""

    def __init__(self, tokenizer: Tokenizer, settings: dict | None = None):
        self.backend_tokenizer = tokenizer
        self.settings = dict(settings or {})
        self.pad_token = self.settings.get("pad_token", "[PAD]")
        self.pad_token_id = tokenizer.token_to_id(self.pad_token)
        if self.pad_token_id is None:
            raise ValueError(f"the tokenizer has no padding token {self.pad_token!r}")
        # a model's own limit; the encoders cut at their manifest's max_length below it
        self.model_max_length = stated_limit(self.settings)
        self._lock = threading.Lock()  # truncation and padding are settings of the shared backend

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __getstate__(self) -> dict:  # copies and pickles (Ray workers) take a lock of their own
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def __call__(self, first: str | Sequence[str], second: str | Sequence[str] | None = None, *,
                 padding: bool | str = True, truncation: bool = True, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str = "pt") -> dict:
        if return_tensors not in ("pt", "np"):
            raise ValueError("return_tensors must be 'pt' (torch tensors) or 'np' (NumPy arrays)")
        first = [first] if isinstance(first, str) else list(first)
        if second is not None:
            second = [second] if isinstance(second, str) else list(second)
            if len(second) != len(first):
                raise ValueError(f"{len(first)} first texts but {len(second)} second texts")
        limit = max_length if max_length is not None else self.model_max_length
        with self._lock:
            backend = self.backend_tokenizer
            if truncation:
                backend.enable_truncation(limit, strategy="longest_first")
            else:
                backend.no_truncation()
            if padding == "max_length":
                backend.enable_padding(pad_id=self.pad_token_id, pad_token=self.pad_token, length=limit)
            elif padding:
                backend.enable_padding(pad_id=self.pad_token_id, pad_token=self.pad_token,
                                       pad_to_multiple_of=pad_to_multiple_of)
            else:
                backend.no_padding()
            encodings = backend.encode_batch(first if second is None else list(zip(first, second)))
        arrays = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        if return_tensors == "np":
            return arrays
        import torch

        return {name: torch.from_numpy(array) for name, array in arrays.items()}

    def save_pretrained(self, path: str | Path) -> None:
        """``tokenizer.json`` (no padding or truncation state) and the settings it was read with."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.backend_tokenizer.no_padding()
            self.backend_tokenizer.no_truncation()
            self.backend_tokenizer.save(str(path / TOKENIZER_FILE))
        (path / TOKENIZER_CONFIG).write_text(json.dumps(self.settings, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(path: str | Path):
    """The tokenizer saved in a model directory: :class:`FastTokenizer` where it has ``tokenizer.json``, else
    (a checkpoint with only a vocabulary file) ``transformers``' ``AutoTokenizer``."""
    path = Path(path)
    if (path / TOKENIZER_FILE).is_file():
        config = path / TOKENIZER_CONFIG
        settings = json.loads(config.read_text()) if config.is_file() else {}
        return FastTokenizer(Tokenizer.from_file(str(path / TOKENIZER_FILE)), settings)
    from transformers import AutoTokenizer

    from mgeo_index.model.manifest import quiet_transformers

    quiet_transformers()
    return AutoTokenizer.from_pretrained(path)
