#!/usr/bin/env bash
# GPU checks, on a machine with an NVIDIA GPU (about 3 minutes): environment, GPU tests, benchmark.
# Writes everything to one log, $OUT/check.log (or ./device-check/check.log): the device tool brings back
# at most 8 files, and scripts/device_train.sh, run before it in the same call, fills 7.
#   bash scripts/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-device-check}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOG"

# 1. environment: the lent machine has no network. Its python3 already holds CUDA torch, Triton,
#    transformers, tokenizers, safetensors, numpy, scipy, typer, rich, pytest; the rest (faiss-cpu,
#    sqlalchemy, rapidfuzz, opencc) arrives as wheels in .whl/ made here beforehand by
#    scripts/device_prepare.sh and carried with the call (device tool: carry [".whl"]). faiss-cpu
#    (19 MB) is left out when the tree would pass the tool's 64 MB: its GPU test then skips, saying so.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=python3
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" | tee -a "$LOG"

# 2. GPU tests: Triton kernels vs torch on CUDA, FP16 vs FP32 embeddings and labels, FAISS GPU vs CPU
TRITON_INTERPRET=0 timeout 120 $PY -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider 2>&1 | tee -a "$LOG" || true

# 3. benchmark on the GPU: the bundled model (sample catalog repeated to 20,000 addresses)
python3 - <<'PY'
import csv, pathlib
rows = list(csv.DictReader(open("mgeo_index/data/sample_catalog.csv", encoding="utf-8")))
out = pathlib.Path("device-check-addresses.csv")
with out.open("w", encoding="utf-8", newline="") as fh:
    w = csv.writer(fh); w.writerow(["id", "address"])
    for i in range(20000):
        w.writerow([i, f"{rows[i % len(rows)]['address']}{i // len(rows)}室"])
PY
MGEO_INDEX_DEVICE=cuda timeout 120 $PY - <<'PY' 2>&1 | tee -a "$LOG"
import json, time, torch
from mgeo_index import inference, kernels, settings
from mgeo_index.model.bi_encoder import load_bi_encoder
import csv
texts = [r["address"] for r in csv.DictReader(open("device-check-addresses.csv", encoding="utf-8"))]
bi = load_bi_encoder(settings.DEFAULT_BI_MODEL).to("cuda")
report = {}
for precision in ("fp16", "fp32"):
    inference.encode(bi, texts[:2048], device="cuda", precision=precision)
    torch.cuda.synchronize(); t = time.perf_counter()
    inference.encode(bi, texts, device="cuda", precision=precision)
    torch.cuda.synchronize(); report[f"default_model_{precision}_addresses_per_s"] = len(texts) / (time.perf_counter() - t)
# a BERT-base-sized encoder (random weights: speed only)
from transformers import BertConfig, BertModel
from mgeo_index.model.bi_encoder import BiEncoder
base = BiEncoder(BertModel(BertConfig(vocab_size=len(bi.tokenizer), hidden_size=768, num_hidden_layers=12,
                                      num_attention_heads=12, intermediate_size=3072), add_pooling_layer=False),
                 bi.tokenizer).to("cuda").eval()
inference.encode(base, texts[:2048], device="cuda", precision="fp16")
torch.cuda.synchronize(); t = time.perf_counter()
inference.encode(base, texts, device="cuda", precision="fp16")
torch.cuda.synchronize(); report["bert_base_fp16_addresses_per_s"] = len(texts) / (time.perf_counter() - t)
x = torch.randn(65536, 256, device="cuda")
for name, fn in (("triton_l2", lambda: kernels.l2_normalize(x, backend="triton")), ("torch_l2", lambda: kernels.torch_l2_normalize(x)),
                 ("triton_softmax", lambda: kernels.softmax(x, backend="triton")), ("torch_softmax", lambda: kernels.torch_softmax(x))):
    fn(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(100): fn()
    torch.cuda.synchronize(); report[f"{name}_ms"] = (time.perf_counter() - t) * 10
print(json.dumps(report, indent=2))
PY
rm -f device-check-addresses.csv
echo "device check done: $OUT"
