"""Store a model directory's Linear weights in int8, per output channel (``mgeo_index.model.bert.int8_weights``):
half the bytes, and on the ``int8`` backend the network computes as it did from the FP16 file.

    python scripts/quantize_weights.py mgeo_index/model/accurate/cross

Rewrites ``DIR/model.safetensors`` in place (atomically); embeddings, LayerNorm, biases and narrow layers stay
FP16. Measure before shipping (``mgeo-index eval pairs … --profile …`` under ``--backend torch`` and ``int8``):
docs/models.md has the figures of the shipped accurate network.
"""
import argparse
from pathlib import Path

from safetensors.torch import save_file

from mgeo_index import files
from mgeo_index.model.bert import SCALE_SUFFIX, WEIGHTS, int8_weights, read_weights

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_dir", type=Path)
args = parser.parse_args()
path = args.model_dir / WEIGHTS
state = read_weights(args.model_dir)
stored = int8_weights(state)
before = path.stat().st_size
files.replace_atomic(path, lambda tmp: save_file(stored, tmp, metadata={"format": "pt"}))
print(f"{path}: {before / 2**20:.1f} MiB -> {path.stat().st_size / 2**20:.1f} MiB, "
      f"{sum(name.endswith(SCALE_SUFFIX) for name in stored)} Linear weights in int8")
