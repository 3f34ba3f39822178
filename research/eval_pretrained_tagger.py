"""How far a pretrained encoder lifts element tagging: the tagger's CRF over the teacher's transformer.

The shipped tagger (embedding → trigram convolution → BiLSTM 64 → CRF) learns from the 48,335 tagged training
addresses alone. The teacher (``teacher/cross-snapshot.safetensors``: 12 layers × 384 trained on a
GPU, or an earlier 8 × 384 one trained on the CPU; masked-language pretrained on the shared address text, then fine-tuned on the
labelled pairs) has read far more address text; here its
encoder replaces the embedding, convolution and BiLSTM, a linear layer gives the emissions, and the same CRF,
training loop (:func:`mgeo_index.training.tagger.fit`), split and scoring as ``scripts/train_tagger.py`` follow.
It prints the test F1, pooled and per tagged file, as ``train_tagger`` reports them, so the two read side by side.
Not a shipped model (15.8 M or 22.9 M parameters against the tagger's 0.53 M): it measures whether pretraining is
the lever for the element-F1 target (README, *What limits the element F1*: it is not).

    OMP_NUM_THREADS=1 python research/eval_pretrained_tagger.py --data ../shared/data --minutes 60
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from mgeo_index.text.parser import tag_batched
from mgeo_index.text.tagger import TaggerConfig
from mgeo_index.training.tagger import EncoderTagger, evaluate, f1_by_file, fit, load_examples
from mgeo_index.training.teacher import load_teacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teacher", type=Path, default=Path("teacher/cross-snapshot.safetensors"))
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--lr", type=float, default=1e-4, help="the encoder's peak learning rate (the CRF's: 3e-3)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--select-files", default=None, metavar="FILE,FILE",
                        help="keep the epoch with the best mean of these tagged files' own dev F1, as train_tagger")
    parser.add_argument("--save", type=Path, default=None, help="write the kept weights here (torch.save)")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    data = load_examples(args.data, unmask=True)
    select = tuple(args.select_files.split(",")) if args.select_files else ()
    select_dev = [load_examples(args.data, (name,))["dev"] for name in select]
    teacher = load_teacher(args.teacher)
    labels = sorted({s[0] for _, spans in data["train"] for s in spans})
    cfg = TaggerConfig(chars=[], labels=labels, max_length=teacher.model.config.max_position_embeddings - 2)
    model = EncoderTagger(cfg, teacher.model.bert, teacher.tokenizer, bf16=args.precision == "bf16")
    encoder = [p for n, p in model.named_parameters() if n.startswith("bert.")]
    crf = [p for n, p in model.named_parameters() if not n.startswith("bert.")]
    opt = torch.optim.AdamW([{"params": encoder, "lr": args.lr}, {"params": crf, "lr": 3e-3}], weight_decay=1e-4)
    started = time.time()
    fitted = fit(model, opt, data["train"], data["dev"], select_dev, minutes=args.minutes, rng=rng,
                 log=lambda m: print(m, flush=True), batch_size=32)
    model.eval()
    test = evaluate(model, load_examples(args.data)["test"], batch_size=128)
    if args.save:
        torch.save(model.state_dict(), args.save)
    print(json.dumps({
        "command": "python research/eval_pretrained_tagger.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "encoder": {"layers": teacher.model.config.num_hidden_layers, "hidden": teacher.model.config.hidden_size,
                    "snapshot": str(args.teacher)},
        **fitted, "minutes": round((time.time() - started) / 60, 1),
        "test_f1": round(test["without_redundant"]["f1"], 4),
        "test_per_label": test["without_redundant"]["per_label"],
        "test_f1_by_file": f1_by_file(lambda texts: tag_batched(model, texts, batch_size=128), args.data),
    }, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
