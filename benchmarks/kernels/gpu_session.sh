#!/usr/bin/env bash
# One GPU session for the kernels: environment, tests/kernels, then the benchmarks.
#
# Run from the repository root on the GPU machine, with
#   .vendor/vllm_flashmla/  vLLM 0.33.0's bundled FlashMLA, extracted from the wheel:
#       unzip vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl 'vllm/_flashmla_C.abi3.so' \
#           'vllm/_flashmla_extension_C.abi3.so' 'vllm/third_party/flashmla/*' -d .vendor/vllm_flashmla
#   .vendor/core/           `git archive HEAD dsv4sel rules | tar -x -C .vendor/core` (the committed core,
#                           so a half-edited working tree does not break the kernel tests)
#   .whl/                   wheels the machine lacks (jsonschema and its dependencies), optional
# Writes logs and JSON to ${OUT:-/tmp/out}.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
ROOT=$PWD
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

{
  echo "== environment"
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  $PY - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
try:
    import triton
    print("triton", triton.__version__)
except Exception as exc:
    print("triton: not importable", exc)
EOF
  $PY -m pip list 2>/dev/null | grep -i -E "^(pytest|hypothesis|jsonschema|pyyaml|vllm|flash|numpy|triton|torch) "
} 2>&1 | tee "$OUT/env.txt"

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
rm -rf /tmp/pkg && mkdir -p /tmp/pkg
cp -r .vendor/core/dsv4sel /tmp/pkg/dsv4sel
cp -r .vendor/core/rules /tmp/pkg/dsv4sel/rules
ln -s "$ROOT/kernels" /tmp/pkg/dsv4sel/kernels
export PYTHONPATH=/tmp/pkg:/tmp/site
export DSV4SEL_VLLM_FLASHMLA_DIR="$ROOT/.vendor/vllm_flashmla"

{
  echo "== FlashMLA build"
  (cd /tmp && $PY -c "from dsv4sel.kernels.flashmla import flashmla_build as b, DeepseekV4FlashMLASparseImpl as I; print(b().describe()); print(I.is_available())")
} 2>&1 | tee "$OUT/build.txt"

if [ -n "${PACK_LAYER:-}" ]; then  # issue 33: the pack layer's decode call site vs vLLM's FlashMLA call
  echo "== probe_pack_layer"
  (cd "$ROOT/benchmarks/kernels" && timeout 300 $PY probe_pack_layer.py --json "$OUT/pack_layer.json") 2>&1 \
      | tee "$OUT/pack_layer.txt"
  exit "${PIPESTATUS[0]}"
fi

echo "== tests/kernels"
[ -n "${SKIP_TESTS:-}" ] || (cd /tmp && timeout 420 $PY -m pytest "$ROOT/tests/kernels" -c "$ROOT/pyproject.toml" --rootdir "$ROOT" \
    -p no:cacheprovider -q -rs --tb=short --durations=10) 2>&1 | tee "$OUT/pytest.txt" | tail -60

[ -z "${SKIP_BENCH:-}" ] || exit 0
cd "$ROOT/benchmarks/kernels"
echo "== bench_issue21 (every figure of issue 21's table, one run)"
timeout 420 $PY bench_issue21.py --rounds 15 --json "$OUT/issue21.json" 2>&1 | tee "$OUT/issue21.txt"
[ -z "${ISSUE21_ONLY:-}" ] || exit 0
echo "== bench_flashmla_plan_run"
timeout 240 $PY bench_flashmla_plan_run.py --batch ${BENCH_BATCH:-64} --heads ${BENCH_HEADS:-64} \
    --json "$OUT/flashmla.json" 2>&1 | tee "$OUT/flashmla.txt"
[ -z "${SKIP_CODECS:-}" ] || exit 0
echo "== bench_codecs"
timeout 300 $PY bench_codecs.py ${CODEC_ARGS:-} --json "$OUT/codecs.json" 2>&1 | tee "$OUT/codecs.txt"
