#!/usr/bin/env bash
# Download, on this machine, the wheels the lent GPU machine lacks (it has no network), for its
# Python 3.12 / x86-64, into .whl/ (ignored by git): carry ".whl" in the device tool's call. WHEELS="sqlalchemy
# greenlet rapidfuzz opencc" leaves out faiss-cpu (19 MB) when the tree that travels would pass 64 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl ${WHEELS:-faiss-cpu sqlalchemy greenlet rapidfuzz opencc}
du -sh .whl
