#!/usr/bin/env bash
# `make gpu-check`'s isolation checks in one go on a lent GPU machine that has NVIDIA's
# driver, CUDA, a python3 with PyTorch and CuPy, and no network: run from the repository
# root, after `make gpu-bundle` here, with these ignored paths carried along:
#   build/hami-core/x86_64  (make hami-core's library and stamp)
#   .whl                    (the project's dependencies that machine's Python lacks)
#   protos                  (with the generated protobuf stubs)
# It writes under $OUT (or ./gpu-out): gpu-check.json (the report; copy it to
# docs/gpu-check/<date>-<gpu>.json and run python -m tools.gpu_table), pytest.log and
# rows.md (the report's table rows). GPU_ALL=1 adds the node checks (discovery, the agent,
# usage) after the isolation checks. The GPU's settings are left as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
library="$PWD/build/hami-core/x86_64/libvgpu.so"
if [ ! -f "$library" ] || [ ! -f "${library%.so}.json" ]; then
  echo "gpu_run: no $library and its stamp: carry build/hami-core/x86_64 (make gpu-bundle)" >&2
  exit 2
fi
pythonpath="$PWD"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/tessera-site .whl/*.whl || exit 3
  pythonpath="/tmp/tessera-site:$PWD"
fi
export PYTHONPATH="$pythonpath" PYTHONUNBUFFERED=1
export TESSERA_REQUIRE_GPU=1 TESSERA_GPU_REPORT="$out/gpu-check.json"
export TESSERA_HAMI_CORE_LIBRARY="$library" TESSERA_CUDA_PYTHON=python3
# HOOK POINT: the node DaemonSet's MPS supervisor, as a command line that starts NVIDIA's
# control daemon with the pipe and log directories from its environment and restarts it
# when it dies (tests/gpu/conftest.py, MpsDaemon). Unset, the checks start the daemon as
# that supervisor does and stand in for its restarts.
export TESSERA_MPS_SUPERVISOR="${TESSERA_MPS_SUPERVISOR:-}"
{
  echo "== $(date -u +%FT%TZ) gpu_run on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  cat "${library%.so}.json"
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  python3 -c "import cupy; print('cupy', cupy.__version__)" || echo "no CuPy: cooperative launches and costs are not measured"
} 2>&1 | tee "$out/environment.txt"
files=(tests/gpu/test_sharing.py tests/gpu/test_layers.py)
if [ -n "${GPU_ALL:-}" ]; then
  files+=(tests/gpu/test_real_gpu.py tests/gpu/test_usage.py)
fi
# -W default: this machine's packages are not the ones the suite pins, and a deprecation
# warning from one of them must not stop a lent machine's run
timeout "${GPU_RUN_TIMEOUT_S:-540}" python3 -m pytest -m gpu -rA -p no:cacheprovider \
  -W default "${files[@]}" 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
python3 -m tools.gpu_table --print "$out/gpu-check.json" | tee "$out/rows.md"
exit "$status"
