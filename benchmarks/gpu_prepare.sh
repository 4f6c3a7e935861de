#!/usr/bin/env bash
# Here, on the CPU machine, from the project's root, in its venv (the model cache built by a first run): makes .gpu/
# (git-ignored, ~40 MB) for benchmarks/gpu_check.sh on a GPU machine without network (docs/benchmarks.md):
# - the pure-python wheels the GPU image lacks (hydra-core, omegaconf, antlr4, platformdirs);
# - transformers at the project's minimum (MIN_TRANSFORMERS: older ones ignore the engine's cache) and the newest
#   huggingface_hub 1.x. Not this venv's transformers: 5.25 and newer need huggingface_hub 2.4, whose httpx2 the
#   image lacks, and the image's transformers 5.17 brings a hub 1.x that can be too old for 5.24;
# - the Qwen configs and tokenizer files (no weights).
set -eu
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
ver() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
MIN=$(python -c "from specresearch.models.loading import MIN_TRANSFORMERS as v; print(v)")
rm -rf .gpu && mkdir -p .gpu/whl/tf
for p in hydra-core omegaconf platformdirs; do pip download -q --no-deps -d .gpu/whl "$p==$(ver $p)"; done
pip wheel -q --no-deps -w .gpu/whl "antlr4-python3-runtime==$(ver antlr4-python3-runtime)"
pip download -q --no-deps -d .gpu/whl/tf "transformers~=$MIN.0" "huggingface_hub>=1.31,<2"
CACHE=${SPECRESEARCH_CACHE:-$HOME/.cache/specresearch/models}
for m in 1.5b:tok15 0.5b:tok05; do
  src="$CACHE/qwen2.5-coder-${m%%:*}"; dst=".gpu/${m##*:}"; mkdir -p "$dst"
  for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f "$src/$f" ] && cp "$src/$f" "$dst/"
  done
done
ls .gpu/whl .gpu/whl/tf; du -sh .gpu
