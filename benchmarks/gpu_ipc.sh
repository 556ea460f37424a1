#!/usr/bin/env bash
# Issue 5 on the GPU machine in one call: VMM probe, the IPC/store GPU tests, the IPC benchmark.
#   bash .gpu/run bash benchmarks/gpu_ipc.sh
set -uo pipefail
out=${OUT:-/tmp/pystrom-out}
mkdir -p "$out"
python3 - <<'PY'
import cupy
from pystrom.ipc._cuda import device_uuid, vmm_probe
print("gpus", cupy.cuda.runtime.getDeviceCount(), "uuid", device_uuid(0).hex(),
      "props uuid", cupy.cuda.runtime.getDeviceProperties(0).get("uuid"))
print("VMM POSIX-fd allocations:", vmm_probe(0) or "work")
PY
echo "== gpu tests (ipc, store, stress)"
timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -s tests/test_ipc.py tests/test_store.py \
  tests/test_store_stress.py 2>&1 | tee "$out/ipc-tests.log" | grep -E "gives|stress|device memory|passed|failed|Error|error" | tail -40
echo "== bench"
timeout 150 python3 benchmarks/run.py --only ipc 2>&1 | tee "$out/bench-ipc.log" | tail -22
