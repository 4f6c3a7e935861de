#!/usr/bin/env bash
# benchmarks/gpu_check.py on a GPU machine without network, as the device tool lends one:
#   here (the venv active, the model cache built):  bash benchmarks/gpu_prepare.sh       # .gpu/: wheels, transformers 5.24
#   there, from the project's root:                 OUT=<results folder> bash benchmarks/gpu_check.sh [gpu_check.py options]
#   (with the device tool: run("OUT=$OUT bash benchmarks/gpu_check.sh ...", carry=[".gpu"]))
# Installs .gpu/'s wheels into /tmp (the image's transformers 5.17 ignores the engine's KV cache), then runs the
# check under `timeout $LIMIT` (default 520 s), its report in $OUT/gpu_check.json and its log in $OUT/run_log.txt.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export OUT=${OUT:-/tmp/gpu_out}
SITE=/tmp/site; SITE_TF=/tmp/site_tf
[ -d .gpu/whl ] || { echo "error: no .gpu/whl here: run bash benchmarks/gpu_prepare.sh on the CPU machine first (docs/benchmarks.md)"; exit 2; }
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
rm -rf "$SITE" "$SITE_TF"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu/whl/*.whl
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_TF" .gpu/whl/tf/transformers-*.whl
export PYTHONPATH="$SITE_TF:$SITE:$PWD"
"$PY" -c "import transformers" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE_TF" .gpu/whl/tf/huggingface_hub-*.whl
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  timeout "${LIMIT:-520}" "$PY" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" "$@"; echo "exit $?"
} 2>&1 | grep -v -E "^\s*$" | tee -a "$OUT/run_log.txt"
