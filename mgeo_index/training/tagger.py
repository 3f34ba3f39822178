"""Training and evaluation of the element tagger (mgeo_index.text.tagger) on the shared tagged addresses.

Examples: ``catalog/tagged_addresses_*.jsonl.gz``; each element span is normalized on its own
(so the text is what ``normalize`` produces and labels stay aligned), case variants of a label are
merged (devZone → devzone). Split by a fixed hash of the normalized text: bucket 0 of 10 → ``test``
(held out, reported), bucket 1 → ``dev`` (picks the best epoch), the rest → ``train``.
"""
from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from mgeo_index.text.gazetteer import LEVELS
from mgeo_index.text.normalize import normalize
from mgeo_index.measure.splits import split_of
from mgeo_index.text.parser import admin_mentions, tag_batched
from mgeo_index.text.tagger import PAD, UNK, Tagger, TaggerConfig, load_tagger, tags_from_spans
from mgeo_index.training.tagger_network import TaggerNetwork
from mgeo_index.training.data import TAGGED_FILES, ccks_extra_pairs, ccks_pairs, tagged_addresses, unlabeled_addresses

Example = tuple[str, list[tuple[str, int, int]]]  # (text, [(label, start, end)])


def split_of_text(text: str) -> str:
    bucket = int(hashlib.md5(text.encode()).hexdigest(), 16) % 10
    return "test" if bucket == 0 else "dev" if bucket == 1 else "train"


def to_example(row: dict) -> Example | None:
    """Normalized text and spans of one tagged row; None when the elements do not spell the text."""
    elements = row.get("elements") or []
    if "".join(span for _, span in elements) != row["text"]:
        return None  # a few rows lost digits from the text but not from the elements
    text, spans = "", []
    for label, span in elements:
        span = normalize(span)
        if span:
            spans.append((label.lower(), len(text), len(text) + len(span)))
            text += span
    return (text, spans) if text else None


# Files whose digits are masked as 0 (CCKS2021 track 2: "金型路000号"). Evaluation draws them again (real
# addresses have digits); training leaves them as they are unless asked (README: drawing them again for training
# measured no better).
MASKED_DIGIT_FILES = ("tagged_addresses_ccks2021_track2.jsonl.gz",)


def text_rng(text: str) -> random.Random:
    """A random generator seeded by ``text`` (the same draws for the same text, in every run)."""
    return random.Random(hashlib.md5(text.encode()).hexdigest())


def redraw_zeros(text: str, rng: random.Random) -> str:
    """``text`` with each 0 replaced by a random digit (the masked files' digits drawn again)."""
    return "".join(str(rng.randrange(10)) if c == "0" else c for c in text)


def unmask_digits(row: dict) -> dict:
    """``row`` with each 0 of its text and element spans replaced by a random digit (consistently: the
    elements still spell the text), seeded by the text."""
    rng = text_rng(row["text"])
    elements = [[label, redraw_zeros(span, rng)] for label, span in row.get("elements") or []]
    return row | {"elements": elements, "text": "".join(span for _, span in elements)
                  if "".join(span for _, span in row.get("elements") or []) == row["text"] else row["text"]}


def load_examples(data_dir: Path, files: tuple[str, ...] | None = None, *, unmask: bool = True) -> dict[str, list[Example]]:
    """Train / dev / test examples of the tagged files (``files``: only these); ``unmask``: the digits of the
    masked files drawn again (:func:`unmask_digits`). An address's split follows its text as the file has it,
    so it is the same with and without ``unmask``."""
    out: dict[str, list[Example]] = {"train": [], "dev": [], "test": []}
    seen = set()
    for row in tagged_addresses(data_dir, files):
        original = to_example(row)
        example = to_example(unmask_digits(row)) if unmask and row["file"] in MASKED_DIGIT_FILES else original
        if example and original and example[0] not in seen:
            seen.add(example[0])
            out[split_of_text(original[0])].append(example)
    return out


def untagged_texts(data_dir: Path, exclude: set[str], limit: int, seed: int = 0) -> list[str]:
    """Up to ``limit`` normalized address texts without tags, for a teacher to label: the track-2 unlabelled
    inputs (their masked digits drawn again, as the tagged file's are) and both texts of the train-split CCKS
    pairs (the messy queries the matcher parses), deduplicated, minus ``exclude`` (the tagged dev and test
    texts), shuffled with ``seed``."""
    texts = [redraw_zeros(t, text_rng(t)) for t in unlabeled_addresses(data_dir)]
    texts += [text for pair in ccks_pairs(data_dir) + ccks_extra_pairs(data_dir) if split_of(pair.group) == "train"
              for text in (pair.a, pair.b)]
    texts = [t for t in dict.fromkeys(normalize(t) for t in texts) if t and t not in exclude]
    random.Random(seed).shuffle(texts)
    return texts[:limit]


def teacher_examples(teacher: Tagger, texts: list[str]) -> list[Example]:
    """``texts`` with the teacher's tag paths as their spans (self-training: the student learns them as gold)."""
    return list(zip(texts, tag_batched(teacher, texts)))


def entity_scores(gold: list[list[tuple]], pred: list[list[tuple]], ignore: tuple[str, ...] = ("redundant",)) -> dict:
    """Entity-level micro precision / recall / F1 (exact span and label), and F1 per label."""
    tp, n_gold, n_pred = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred):
        g = {s for s in g if s[0] not in ignore}
        p = {s for s in p if s[0] not in ignore}
        for s in g:
            n_gold[s[0]] += 1
        for s in p:
            n_pred[s[0]] += 1
        for s in g & p:
            tp[s[0]] += 1

    def f1(t, ng, np_):
        prec, rec = (t / np_ if np_ else 0.0), (t / ng if ng else 0.0)
        return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)

    prec, rec, micro = f1(sum(tp.values()), sum(n_gold.values()), sum(n_pred.values()))
    return {
        "precision": prec, "recall": rec, "f1": micro, "entities": sum(n_gold.values()),
        "per_label": {k: round(f1(tp[k], n_gold[k], n_pred[k])[2], 4) for k in sorted(n_gold)},
    }


def evaluate(model: TaggerNetwork, examples: list[Example], batch_size: int = 512) -> dict:
    model.eval()
    pred = []
    for i in range(0, len(examples), batch_size):
        pred += model.tag([t for t, _ in examples[i : i + batch_size]])
    gold = [spans for _, spans in examples]
    return {"without_redundant": entity_scores(gold, pred), "all_labels": entity_scores(gold, pred, ignore=())}


def f1_by_file(tag, data_dir: Path, split: str = "test") -> dict[str, dict]:
    """Element F1 (redundant spans aside) of ``tag`` (texts → spans) on each tagged file's own ``split``
    examples and gold spans: the files follow different conventions (NCAP's, mostly Zhejiang, tags a 村 as
    ``community`` where swei412's nationwide file says ``village``), and the held-out parsing addresses are nationwide
    and Zhejiang ones, so the files' mean is closer to it than the pooled F1, which the largest file leads."""
    out = {}
    for name in TAGGED_FILES:
        own = load_examples(data_dir, (name,))[split]
        scores = entity_scores([spans for _, spans in own], tag([text for text, _ in own]))
        out[name] = {"examples": len(own), "f1": round(scores["f1"], 4)}
    return out


def _batches(examples: list[Example], size: int, rng: random.Random):
    """Length-bucketed shuffled batches: sort chunks of 50 batches by length, shuffle the batches."""
    order = examples[:]
    rng.shuffle(order)
    batches = []
    for i in range(0, len(order), size * 50):
        chunk = sorted(order[i : i + size * 50], key=lambda e: len(e[0]))
        batches += [chunk[j : j + size] for j in range(0, len(chunk), size)]
    rng.shuffle(batches)
    return batches


class EncoderTagger(TaggerNetwork):
    """The CRF tagger with a pretrained character transformer (a ``BertModel`` and its character tokenizer: one
    token per character) in place of its embedding, convolution and BiLSTM: ``research/eval_pretrained_tagger.py``
    measures what pretraining adds to element tagging. Not saved or shipped (the parser tags with :class:`~mgeo_index.text.tagger.Tagger`)."""

    def __init__(self, cfg: TaggerConfig, bert, tokenizer, *, bf16: bool = False):
        super().__init__(cfg)
        if (tokenizer.pad_token_id, tokenizer.unk_token_id) != (PAD, UNK):
            raise ValueError(f"the tokenizer's [PAD] / [UNK] ids must be the tagger's {PAD} / {UNK}")
        del self.embed, self.conv, self.lstm  # the encoder stands for them
        self.char_ids = tokenizer.get_vocab()  # so TaggerNetwork.encode gives the encoder's ids, padded with [PAD]
        self.bert, self.bf16 = bert, bf16
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.out = nn.Linear(bert.config.hidden_size, len(self.tags))

    def emissions(self, ids, mask):
        lengths = mask.sum(1)
        B = ids.shape[0]
        full = torch.cat([torch.full((B, 1), self.cls), ids, torch.full((B, 1), PAD)], dim=1)
        full[torch.arange(B), lengths + 1] = self.sep
        attention = torch.arange(full.shape[1])[None, :] < (lengths + 2)[:, None]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            hidden = self.bert(input_ids=full, attention_mask=attention.long()).last_hidden_state
        return self.out(self.drop(hidden[:, 1 : ids.shape[1] + 1].float()))


def fit(model: TaggerNetwork, opt: torch.optim.Optimizer, train: list[Example], dev: list[Example],
        select_dev: list[list[Example]] = (), *, minutes: float, rng: random.Random, log=print,
        batch_size: int = 128) -> dict:
    """Train ``model`` on ``train`` for ``minutes`` of wall clock (each optimizer group's learning rate decays
    linearly from its initial value to 5% of it), evaluate on ``dev`` after each epoch and leave the model with
    the best epoch's weights: the best pooled dev F1, or the best mean of ``select_dev``'s F1 (one list of dev
    examples per file) when given. Returns epochs, steps, the kept epoch's pooled dev F1 and its selected score."""
    tag_id = {t: i for i, t in enumerate(model.cfg.tags)}
    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
    start, epoch, step, best, kept = time.time(), 0, 0, -1.0, {}
    while time.time() - start < minutes * 60:
        epoch += 1
        model.train()
        for batch in _batches(train, batch_size, rng):
            ids, mask = model.encode([t for t, _ in batch])
            tags = torch.zeros_like(ids)
            for row, (text, spans) in enumerate(batch):
                tags[row, : len(text)] = torch.tensor([tag_id[t] for t in tags_from_spans(len(text), spans)][: ids.shape[1]])
            frac = min((time.time() - start) / (minutes * 60), 1.0)
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * max(0.05, 1 - frac)
            loss = model.loss(ids, mask, tags)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            step += 1
            if time.time() - start > minutes * 60:
                break
        pooled = evaluate(model, dev)["without_redundant"]["f1"]
        by_file = [evaluate(model, own)["without_redundant"]["f1"] for own in select_dev]
        log(f"epoch {epoch} step {step} loss {loss.item():.3f} dev F1 {pooled:.4f}"
            + (f" (files {' '.join(f'{f:.4f}' for f in by_file)})" if by_file else "") + f" ({time.time() - start:.0f}s)")
        score = sum(by_file) / len(by_file) if by_file else pooled
        if score > best:
            best, kept = score, {"dev_f1": round(pooled, 4), "selected": round(score, 4),
                                 "state": {k: v.clone() for k, v in model.state_dict().items()}}
    model.load_state_dict(kept.pop("state"))
    return {"epochs": epoch, "steps": step, **kept}


def train_tagger(data_dir: Path, out_dir: Path, *, minutes: float = 15.0, seed: int = 0, log=print,
                 files: tuple[str, ...] | None = None, unmask: bool = False, hidden: int = 128, dim: int = 128,
                 teacher: Path | None = None, teacher_rows: int = 60000, repeat: dict[str, int] | None = None,
                 select_files: tuple[str, ...] | None = None) -> dict:
    """Train within a wall-clock budget, keep the best dev epoch, save to out_dir, report test scores
    (``files``: train on these tagged files only; ``unmask``: train on the masked files' digits drawn again;
    the test split is always all files', digits drawn again; ``hidden``: the LSTM's width each way; ``dim``:
    the character embedding's and convolution's width; ``teacher``: a tagger directory whose tag paths over
    ``teacher_rows`` untagged addresses (:func:`untagged_texts`) join the training examples; ``repeat``: a tagged
    file's training examples seen that many times an epoch, e.g. ``{"tagged_addresses_ncap2019.jsonl.gz": 3}``;
    ``select_files``: keep the epoch with the best mean of these files' own dev F1 instead of the pooled dev F1,
    which the largest file leads — the held-out parsing addresses are swei412's and NCAP's kinds)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    data = load_examples(data_dir, files, unmask=unmask)
    for name, times in (repeat or {}).items():
        if name not in TAGGED_FILES or times < 1:
            raise ValueError(f"repeat: {name}={times}: give one of {', '.join(TAGGED_FILES)} and a count of at least 1")
        data["train"] += load_examples(data_dir, (name,), unmask=unmask)["train"] * (times - 1)
    everything = load_examples(data_dir)
    for name in select_files or ():
        if name not in TAGGED_FILES:
            raise ValueError(f"select_files: {name}: give one of {', '.join(TAGGED_FILES)}")
    select_dev = [load_examples(data_dir, (name,), unmask=unmask)["dev"] for name in select_files or ()]
    taught = None
    if teacher is not None:
        held = {text for split in ("dev", "test") for text, _ in everything[split]}
        started = time.time()
        teacher_model = load_tagger(teacher)
        pseudo = teacher_examples(teacher_model, untagged_texts(data_dir, held, teacher_rows, seed))
        data["train"] = data["train"] + pseudo
        taught = {"test_f1": teacher_model.cfg.metrics.get("test_f1"), "addresses": len(pseudo)}
        log(f"teacher {teacher}: {len(pseudo)} untagged addresses tagged in {time.time() - started:.0f}s")
    counts = Counter(c for text, _ in data["train"] for c in text)
    chars = [c for c, n in counts.most_common() if n >= 2]
    labels = sorted({s[0] for _, spans in data["train"] for s in spans})
    cfg = TaggerConfig(chars=chars, labels=labels, hidden=hidden, dim=dim)
    model = TaggerNetwork(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    log(f"examples: " + ", ".join(f"{k} {len(v)}" for k, v in data.items()) + f"; chars {len(chars)}, labels {len(labels)}")
    start = time.time()
    fitted = fit(model, opt, data["train"], data["dev"], select_dev, minutes=minutes, rng=rng, log=log)
    test = evaluate(model, everything["test"])
    cfg.metrics = {
        "split": "md5(normalized text) % 10: 0 test, 1 dev, else train",
        "examples": {k: len(v) for k, v in data.items()} | {"test": len(everything["test"])},
        "files": list(files) if files is not None else "all tagged files", "unmasked_digits": unmask,
        **({"repeat": repeat} if repeat else {}),
        **({"selected_on": {"dev_f1_mean_of": list(select_files), "mean": fitted["selected"]}} if select_files else {}),
        **({"teacher": taught} if taught is not None else {}),
        "epochs": fitted["epochs"], "steps": fitted["steps"], "minutes": round((time.time() - start) / 60, 1),
        "dev_f1": fitted["dev_f1"],
        "test_f1": round(test["without_redundant"]["f1"], 4),
        "test_f1_all_labels": round(test["all_labels"]["f1"], 4),
        "test_per_label": test["without_redundant"]["per_label"],
        "test_f1_by_file": f1_by_file(lambda texts: tag_batched(model, texts), data_dir),
    }
    model.save(out_dir)
    return cfg.metrics


LEVEL_KEYS = {level: key for level, key in LEVELS.items() if level < 4}  # province, city, district


def admin_accuracy(examples: list[Example], parse_fn, gazetteer) -> dict:
    """Province / city / district resolution accuracy against the gold admin spans.

    Gold: the gazetteer's chain for the gold prov/city/district/town spans (examples whose gold is
    ambiguous or unresolved are left out and counted). ``explicit``: levels written in the address,
    parsed from the full text. ``inferred_from_district``: the province and city spans removed from
    the text (addresses that start at the district), so both must be inferred.
    ``inferred_from_town``: province, city and district removed (addresses that start at the
    town / street), so all three must be inferred from the town name.
    """
    scenarios = {
        "explicit": (set(), None),
        "inferred_from_district": ({"prov", "city"}, 3),
        "inferred_from_town": ({"prov", "city", "district"}, 4),
    }
    counts = {name: {k: [0, 0] for k in LEVEL_KEYS.values()} for name in scenarios}
    skipped = 0
    gold_rows = []
    for text, spans in examples:
        mentions = admin_mentions(text, spans)
        gold = gazetteer.resolve(mentions)
        if not mentions or gold["ambiguous"] or not gold["province_code"]:
            skipped += 1
            continue
        gold_rows.append((text, spans, gold, {level for _, level in mentions}))
    for name, (drop, needs) in scenarios.items():
        rows = [r for r in gold_rows if needs is None or needs in r[3]]
        texts = ["".join(text[s:e] for lab, s, e in spans if lab not in drop) for text, spans, _, _ in rows]
        for (_, _, gold, present), parsed in zip(rows, parse_fn(texts)):
            for level, key in LEVEL_KEYS.items():
                asked = level in present if name == "explicit" else level < needs
                if asked and gold[f"{key}_code"] is not None:
                    counts[name][key][0] += parsed["admin"][f"{key}_code"] == gold[f"{key}_code"]
                    counts[name][key][1] += 1
    report: dict = {"evaluated": len(gold_rows), "skipped_gold_unresolved": skipped}
    for name, levels in counts.items():
        correct, total = sum(c for c, _ in levels.values()), sum(n for _, n in levels.values())
        report[name] = {
            "all": round(correct / total, 4) if total else None,
            **{k: {"accuracy": round(c / n, 4) if n else None, "n": n} for k, (c, n) in levels.items()},
        }
    return report
