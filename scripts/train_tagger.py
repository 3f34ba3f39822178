"""Train the element tagger shipped in mgeo_index/text/tagger/ from ../shared/data (about 15 minutes).

Example: OMP_NUM_THREADS=1 .venv/bin/python scripts/train_tagger.py --data ../shared/data --minutes 15
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mgeo_index.text.tagger import DEFAULT_DIR
from mgeo_index.training.tagger import train_tagger

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
parser.add_argument("--minutes", type=float, default=15.0)
parser.add_argument("--files", default=None,
                    help="comma-separated tagged files to train on (default: all; the test split is always all files')")
parser.add_argument("--unmask-digits", action="store_true",
                    help="train on the track-2 file's masked digits drawn again (evaluation always draws them)")
parser.add_argument("--hidden", type=int, default=128, help="the BiLSTM's width each way (shipped: see tagger.json)")
parser.add_argument("--dim", type=int, default=128, help="the character embedding's and convolution's width")
parser.add_argument("--teacher", type=Path, default=None,
                    help="a tagger directory: its tag paths over untagged addresses join the training examples")
parser.add_argument("--teacher-rows", type=int, default=60000, help="how many untagged addresses the teacher tags")
parser.add_argument("--repeat", action="append", default=[], metavar="FILE=TIMES",
                    help="see a tagged file's training examples TIMES times an epoch (e.g. "
                         "tagged_addresses_ncap2019.jsonl.gz=3); may be given for several files")
parser.add_argument("--select-files", default=None, metavar="FILE,FILE",
                    help="keep the epoch with the best mean of these tagged files' own dev F1 (default: the pooled "
                         "dev F1), e.g. tagged_addresses_swei412.jsonl.gz,tagged_addresses_ncap2019.jsonl.gz")
args = parser.parse_args()
files = tuple(args.files.split(",")) if args.files else None
repeat = {}
for item in args.repeat:
    name, _, times = item.partition("=")
    if not times.isdigit():
        parser.error(f"--repeat {item}: write FILE=TIMES, e.g. tagged_addresses_ncap2019.jsonl.gz=3")
    repeat[name] = int(times)
metrics = train_tagger(args.data, args.out, minutes=args.minutes, log=lambda m: print(m, flush=True), files=files,
                       unmask=args.unmask_digits, hidden=args.hidden, dim=args.dim,
                       teacher=args.teacher, teacher_rows=args.teacher_rows, repeat=repeat or None,
                       select_files=tuple(args.select_files.split(",")) if args.select_files else None)
print(json.dumps(metrics, ensure_ascii=False, indent=1))
