"""Character-level tokenizer built from address text, saved in Hugging Face format.

Every character is one token (Chinese addresses are short and character-compositional). The
tokenizer normalizes with NFKC + lowercase so full-width ``４７８Ａ`` and ``478a`` share tokens.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_char_tokenizer(
    texts: Iterable[str], *, min_freq: int = 2, max_vocab: int = 12000
) -> PreTrainedTokenizerFast:
    """Vocabulary = special tokens + characters seen at least ``min_freq`` times (most frequent first)."""
    import unicodedata

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
