#!/usr/bin/env bash
# Train the default models on a lent GPU: the same recipe as `mgeo-index train`, with GPU-sized batches,
# bf16 autocast and stage budgets that fit the device tool's 10-minute call (about 7 minutes of training,
# roughly 100x the steps a CPU session gets). Writes bi/, cross/ and metrics.json to $OUT/train (the
# stage checkpoints stay in /tmp: they are large and only needed to resume on that machine).
#
# Prepare here (no device time): bash scripts/fetch_device_wheels.sh && bash scripts/stage_device_data.sh
# Run (device tool): command "bash scripts/device_train.sh", carry [".whl", ".device-data"].
# Afterwards, here: compare $OUT/train/metrics.json with mgeo_index/model/default/metrics.json, then copy
# bi/ and cross/ into mgeo_index/model/default/, rebuild indexes and re-run the README's eval commands.
# On a CPU, SCALE=0.02 bash scripts/device_train.sh runs it end to end in a few minutes (a smoke test).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-device-train}"
DATA="${DATA:-.device-data}"
SCALE="${SCALE:-1}"
mkdir -p "$OUT/train"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
PY="${PYTHON:-python3}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
OUT="$OUT" DATA="$DATA" SCALE="$SCALE" $PY - <<'PY' 2>&1 | tee "$OUT/train.log"
import json, os, shutil
from pathlib import Path

import torch

from mgeo_index.training.train import TrainConfig, train

scale, cuda = float(os.environ["SCALE"]), torch.cuda.is_available()
work = Path("/tmp/mgeo-device-train")
cfg = TrainConfig(
    data_dir=Path(os.environ["DATA"]), out=work,
    mlm_minutes=3.5 * scale, bi_minutes=1.5 * scale, cross_minutes=2.0 * scale,
    mlm_batch=512 if cuda else 128, bi_batch=256 if cuda else 96, cross_batch=256 if cuda else 64,
    precision="auto",  # bf16 on CUDA and on CPUs with AVX512-BF16/AMX
)
metrics = train(cfg)
out = Path(os.environ["OUT"]) / "train"
for name in ("bi", "cross"):
    shutil.rmtree(out / name, ignore_errors=True)
    shutil.copytree(work / name, out / name)
shutil.copy(work / "metrics.json", out / "metrics.json")
print(json.dumps({k: metrics[k] for k in ("stages", "ccks_dev", "shenzhen_dev", "ccks_dev_retrieval", "minutes")}, default=str)[:4000])
PY
