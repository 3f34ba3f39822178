"""The tagger side by side in one process: the NumPy tagger the parser tags with (shipped) against the torch
network it was trained as, on the same length-sorted batches (as the parser cuts them); CPU seconds per batch
set, best of ``--rounds``, paths compared.

    OMP_NUM_THREADS=1 python research/bench_tagger.py --data ../shared/data --addresses 3000
"""
import argparse
import gzip
import json
import time
from itertools import groupby
from pathlib import Path

import torch

from mgeo_index.text.normalize import normalize
from mgeo_index.text.parser import BATCH
from mgeo_index.text.tagger import DEFAULT_DIR, default_tagger
from mgeo_index.training.tagger_network import load_network

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--addresses", type=int, default=3000)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(1)
with gzip.open(args.data / "catalog" / "tagged_addresses_swei412.jsonl.gz", "rt", encoding="utf-8") as fh:
    texts = sorted((normalize(json.loads(line)["text"]) for _, line in zip(range(args.addresses), fh)), key=len)
batches = [same[i : i + BATCH] for _, group in groupby(texts, key=len) for same in [list(group)]
           for i in range(0, len(same), BATCH)]
taggers = {"numpy (shipped)": default_tagger(), "torch network": load_network(DEFAULT_DIR)}
seconds = dict.fromkeys(taggers, 1e9)
paths = {}
with torch.inference_mode():
    for _ in range(args.rounds):
        for name, tagger in taggers.items():
            started = time.process_time()
            paths[name] = [tagger.tag(batch) for batch in batches]
            seconds[name] = min(seconds[name], time.process_time() - started)
print(json.dumps({"addresses": len(texts), "cpu_seconds": {k: round(v, 3) for k, v in seconds.items()},
                  "numpy_speedup": round(seconds["torch network"] / seconds["numpy (shipped)"], 2),
                  "same_paths": paths["numpy (shipped)"] == paths["torch network"]}))
