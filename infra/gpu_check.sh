#!/usr/bin/env bash
# The GPU check, as one prepared run on a machine with a CUDA GPU (see nbs/77_gpu.ipynb), from the repository root:
#   bash infra/gpu_check.sh [OUT_DIR] [key=value ...]      e.g. bash infra/gpu_check.sh "$OUT" recipe=True
# 1. installs the wheels carried in .whl/ (a machine without this project's dependencies; see README, On a GPU),
# 2. runs the CUDA tests (the sampler's graph against the eager loop; a training step that never syncs),
# 3. runs `qmind bench gpu`, writing OUT_DIR/bench_gpu.json after every part (so a crash keeps what was measured).
set -u
out=${1:-.}; shift || true
mkdir -p "$out"
T=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$T/site" .whl/*.whl || exit 3
  export PYTHONPATH="$T/site:$PWD"
fi
export QMIND_STORE="$T/store" QMIND_CACHE="$T/cache" QMIND_RUNS="$T/runs" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 4
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_sampler.py -k cuda 2>&1 | tail -15 | tee "$out/cuda_tests.txt"
timeout 560 python3 -m qmind_render.cli bench --json gpu out="$out/bench_gpu.json" "$@" > "$out/bench_gpu_stdout.json" 2> "$out/bench_gpu.log"
rc=$?
tail -40 "$out/bench_gpu.log"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r.get('targets', r), indent=1))" "$out/bench_gpu.json"
exit $rc
