#!/usr/bin/env bash
# Install, then run the main job on the embedded defaults: index the bundled sample catalog with the
# bundled model into ./demo-index (SQLite store inside it) and resolve two messy addresses.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/mgeo-index build mgeo_index/data/sample_catalog.csv --index-dir demo-index --id-column poi_id
.venv/bin/mgeo-index resolve "深圳南山中山路75号东方科技园9号楼" "北京海淀东风路127号东方大厦" --index-dir demo-index --top-k 3
