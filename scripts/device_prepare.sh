#!/usr/bin/env bash
# Prepare, on this machine (no device time), what a lent GPU machine needs and cannot fetch (it has no network):
#  - .device-data/: the part of ../shared/data that `mgeo-index train` and the teacher read (about 7 MB: every
#    pair file, every catalog and tagged / unlabelled address file, the 4-level divisions), for
#    scripts/device_train.sh — research data, ignored by git and never committed;
#  - .whl/: the wheels its Python 3.12 / x86-64 lacks (it already holds CUDA torch, Triton, transformers,
#    tokenizers, safetensors, numpy, scipy, typer, rich, pytest), for scripts/device_check.sh.
# The device tool's call carries both: carry [".device-data", ".whl"]. WHEELS="sqlalchemy greenlet rapidfuzz
# opencc" leaves out faiss-cpu (19 MB) when the tree that travels would pass 64 MB.
#   bash scripts/device_prepare.sh [SHARED_DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-../shared/data}"
for ignored in /.device-data/ /.whl/; do
  grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
rm -rf .device-data
mkdir -p .device-data/pairs .device-data/catalog .device-data/admin
cp "$SRC"/pairs/*.tsv.gz .device-data/pairs/
cp "$SRC"/catalog/*.gz .device-data/catalog/
cp "$SRC"/admin/jionlp_4level.csv.gz .device-data/admin/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl ${WHEELS:-faiss-cpu sqlalchemy greenlet rapidfuzz opencc}
du -sh .device-data .whl
