#!/usr/bin/env bash
# Copy, on this machine, the part of ../shared/data that `mgeo-index train` reads (about 5 MB) into
# .device-data/ (ignored by git, never committed): the lent GPU machine sees only the repository, so
# the device tool's call carries it (carry [".whl", ".device-data"]) for scripts/device_train.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-../shared/data}"
grep -qx '/.device-data/' .git/info/exclude 2>/dev/null || echo '/.device-data/' >> .git/info/exclude
mkdir -p .device-data/pairs .device-data/catalog .device-data/admin
cp "$SRC"/pairs/ccks2021_train.tsv.gz "$SRC"/pairs/shenzhen_val.tsv.gz .device-data/pairs/
cp "$SRC"/catalog/ccks2021_poi_candidates.tsv.gz "$SRC"/catalog/shenzhen_standard_addresses.txt.gz \
   "$SRC"/catalog/tagged_addresses_*.jsonl.gz .device-data/catalog/
cp "$SRC"/admin/jionlp_4level.csv.gz .device-data/admin/
du -sh .device-data
