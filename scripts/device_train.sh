#!/usr/bin/env bash
# Train the teacher (mgeo_index/training/teacher.py: masked-language pretraining on all address text, then
# fine-tuning with FGM and multi-sample dropout, the best weights on the round-2 calibration pairs kept) on a
# lent GPU, 12 layers x 384 (22.9 M parameters, FP16 snapshot 44 MB: within the 60 MB the repository keeps),
# with GPU-sized batches, bf16 autocast, pretraining batches made by 12 worker processes, and stage budgets
# that fit the device tool's 10-minute call with scripts/device_check.sh after it. Writes to $OUT/train:
# train.log, teacher.json (every stage's steps, minutes and losses), cross-snapshot.json and the FP16 snapshot
# in 15 MB parts (the device tool brings back files of at most 16 MB); the checkpoints stay in /tmp there.
#
# Prepare here (no device time): WHEELS="sqlalchemy greenlet rapidfuzz opencc" bash scripts/device_prepare.sh;
#   git rm --cached teacher/cross-snapshot.safetensors
#   and ignore it for the call (the tree that travels must stay under 64 MB; `git reset -q` afterwards).
# Run (device tool): command "bash scripts/device_train.sh; OUT=$OUT/check bash scripts/device_check.sh",
#   carry [".device-data", ".whl"].
# On an H200: 4.5 minutes with SCALE=0.85; mlm_lr 6e-4 had stalled at the unigram loss (5.71) for
#   all of an earlier 3.5-minute pretraining, 2e-4 learns (loss 2.37, masked accuracy 0.546).
# Afterwards, here: cat $FILES/train/cross-snapshot.safetensors.part* > teacher/cross-snapshot.safetensors, copy
#   cross-snapshot.json beside it, check its sha256, and evaluate it as teacher/README.md says.
# On a CPU, SCALE=0.01 bash scripts/device_train.sh runs it end to end in a few minutes (a smoke test).
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
WORK=/tmp/mgeo-device-teacher
# a second call on the same (still warm) machine resumes the stages from their checkpoints there; a finished
# run then only writes its snapshot again. FRESH=1 starts afresh (e.g. after changing a setting below).
[ "${FRESH:-0}" = 1 ] && rm -rf "$WORK"
rm -rf "$WORK.snapshot"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT="$OUT" DATA="$DATA" SCALE="$SCALE" WORK="$WORK" $PY - <<'PY' 2>&1 | tee "$OUT/train/train.log"
import hashlib, json, os, shutil, time
from pathlib import Path

import torch

from mgeo_index.training.teacher import TeacherConfig, save_snapshot, train_teacher

scale, cuda = float(os.environ["SCALE"]), torch.cuda.is_available()
if cuda:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
work = Path(os.environ["WORK"])
cfg = TeacherConfig(
    data_dir=Path(os.environ["DATA"]), out=work, layers=12, hidden=384, heads=6, intermediate=1536,
    mlm_minutes=3.5 * scale, cross_minutes=1.5 * scale, eval_minutes=0.25 * scale, checkpoint_minutes=2.0,
    mlm_batch=512 if cuda else 32, cross_batch=128 if cuda else 16, mlm_lr=2e-4, cross_lr=6e-5,
    workers=12 if cuda else 2, precision="auto",
    log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True),
)
started = time.time()
record = train_teacher(cfg)
snapshot = Path(str(work) + ".snapshot")
info = save_snapshot(cfg, snapshot)
weights = snapshot / "cross-snapshot.safetensors"
meta = json.loads((snapshot / "cross-snapshot.json").read_text())
meta["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
meta["device"] = torch.cuda.get_device_name() if cuda else "cpu"
meta["wall_minutes"] = (time.time() - started) / 60
out = Path(os.environ["OUT"]) / "train"
(out / "cross-snapshot.json").write_text(json.dumps(meta, indent=2))
shutil.copy(work / "teacher.json", out / "teacher.json")
print(json.dumps(info | {"sha256": meta["sha256"]}, default=str))
PY
split -b 15M -d -a 2 "$WORK.snapshot/cross-snapshot.safetensors" "$OUT/train/cross-snapshot.safetensors.part"
ls -la "$OUT/train"
