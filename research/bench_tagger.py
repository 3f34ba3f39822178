"""The tagger's parts, side by side in one process: its network with the convolution read as per-character
tables (shipped) against the convolution itself, and the Viterbi over the transitions' structure (shipped)
against the full max over every (from, to) pair (the reference in tests/test_parser.py), on the same cached
emissions of the same length-sorted batches; CPU seconds per batch set, best of ``--rounds``, paths compared.

    OMP_NUM_THREADS=1 python research/bench_tagger.py --data ../shared/data --addresses 3000
"""
import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch

from mgeo_index.text.normalize import normalize
from mgeo_index.text.parser import BATCH
from mgeo_index.text.tagger import default_tagger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_parser import _full_viterbi  # noqa: E402  (the reference lives with its test)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--addresses", type=int, default=3000)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(1)
with gzip.open(args.data / "catalog" / "tagged_addresses_swei412.jsonl.gz", "rt", encoding="utf-8") as fh:
    texts = sorted((normalize(json.loads(line)["text"]) for _, line in zip(range(args.addresses), fh)), key=len)
tagger = default_tagger()
batches = [tagger.encode(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
folded = tagger._folded_conv
convolved = lambda ids: tagger.conv(tagger.embed(ids).transpose(1, 2)).transpose(1, 2)  # noqa: E731
paths = {}
with torch.inference_mode():
    seconds = {"network, convolution as tables": 1e9, "network, the convolution": 1e9}
    for _ in range(args.rounds):
        for name, conv in zip(seconds, (folded, convolved)):
            tagger._folded_conv = conv
            started = time.process_time()
            for ids, mask in batches:
                tagger.emissions(ids, mask)
            seconds[name] = min(seconds[name], time.process_time() - started)
    for name, conv in zip(seconds, (folded, convolved)):
        tagger._folded_conv = conv
        paths[name] = [tagger.decode(ids, mask) for ids, mask in batches]
    assert paths["network, convolution as tables"] == paths["network, the convolution"], "the two networks' paths differ"
    tagger._folded_conv = folded
    emissions = {id(ids): tagger.emissions(ids, mask) for ids, mask in batches}
tagger.emissions = lambda ids, mask: emissions[id(ids)]  # decoding alone from here
best = {"full max": 1e9, "structured": 1e9}
for _ in range(args.rounds):
    started = time.process_time()
    full = [_full_viterbi(tagger, ids, mask) for ids, mask in batches]
    best["full max"] = min(best["full max"], time.process_time() - started)
    started = time.process_time()
    structured = [tagger.decode(ids, mask) for ids, mask in batches]
    best["structured"] = min(best["structured"], time.process_time() - started)
    assert full == structured, "the two Viterbi paths differ"
print(json.dumps({"addresses": len(texts), "cpu_seconds": {k: round(v, 3) for k, v in (seconds | best).items()},
                  "network_speedup": round(seconds["network, the convolution"] / seconds["network, convolution as tables"], 2),
                  "decoding_speedup": round(best["full max"] / best["structured"], 2), "same_paths": True}))
