#!/usr/bin/env bash
# Copy, on this machine, the part of ../shared/data that `mgeo-index train` and the teacher read (about 7 MB:
# every pair file, every catalog and tagged / unlabelled address file, the 4-level divisions) into
# .device-data/ (ignored by git, never committed): the lent GPU machine sees only the repository, so the
# device tool's call carries it (carry [".device-data"]) for scripts/device_train.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-../shared/data}"
grep -qx '/.device-data/' .git/info/exclude 2>/dev/null || echo '/.device-data/' >> .git/info/exclude
rm -rf .device-data
mkdir -p .device-data/pairs .device-data/catalog .device-data/admin
cp "$SRC"/pairs/*.tsv.gz .device-data/pairs/
cp "$SRC"/catalog/*.gz .device-data/catalog/
cp "$SRC"/admin/jionlp_4level.csv.gz .device-data/admin/
du -sh .device-data
