"""Classical baseline on the same dev split as the shipped model (for the README's comparison).

char 1–3-gram TF-IDF cosine + rapidfuzz ratios + lengths → logistic regression, trained on the
``train`` split and reported on ``dev`` (splits from ``mgeo_index.measure.splits.split_of``).

    pip install -e '.[eval]' && python research/baseline.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rapidfuzz import fuzz
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from mgeo_index.measure.metrics import classification_report
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data


def features(vectorizer: TfidfVectorizer, a: list[str], b: list[str]) -> np.ndarray:
    va, vb = vectorizer.transform(a), vectorizer.transform(b)
    cosine = np.asarray(va.multiply(vb).sum(1)).ravel()
    rows = [
        [fuzz.ratio(x, y), fuzz.partial_ratio(x, y), fuzz.token_set_ratio(x, y), len(x), len(y), abs(len(x) - len(y))]
        for x, y in zip(a, b)
    ]
    return np.column_stack([cosine, np.asarray(rows, dtype=float) / np.array([100, 100, 100, 50, 50, 50])])


def evaluate(pairs: list[data.Pair]) -> dict:
    split = {s: [p for p in pairs if split_of(p.group) == s] for s in ("train", "dev")}
    texts = {s: ([normalize(p.a) for p in ps], [normalize(p.b) for p in ps]) for s, ps in split.items()}
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    vectorizer.fit(texts["train"][0] + texts["train"][1])
    x_train, x_dev = (features(vectorizer, *texts[s]) for s in ("train", "dev"))
    y_train, y_dev = ([LABELS.index(p.label) for p in split[s]] for s in ("train", "dev"))
    model = LogisticRegression(max_iter=2000, class_weight="balanced").fit(x_train, y_train)
    return classification_report(y_dev, model.predict(x_dev), LABELS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    report = {
        "ccks_dev": evaluate(data.ccks_pairs(args.data)),
        "shenzhen_dev": evaluate(data.shenzhen_pairs(args.data)),
    }
    for name, r in report.items():
        f1 = " / ".join(f"{r['per_class'][label]['f1']:.3f}" for label in LABELS)
        print(f"{name}: macro-F1 {r['macro_f1']:.3f}, accuracy {r['accuracy']:.3f}, F1 exact/partial/not {f1}, n={r['n']}")
    print(json.dumps({k: {"macro_f1": v["macro_f1"], "accuracy": v["accuracy"]} for k, v in report.items()}))


if __name__ == "__main__":
    main()
