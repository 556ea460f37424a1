#!/usr/bin/env bash
# Issue 5 on the GPU machine in one call: VMM probe, the IPC/store GPU tests, the IPC benchmark,
# the 30 s daemon stress test. Full logs land in $OUT.
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
echo "== gpu tests (ipc, store)"
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -s tests/test_ipc.py tests/test_store.py \
  tests/test_ipc_validate.py tests/test_ipc_hostile.py tests/test_ipc_after_import.py tests/test_store_crash.py \
  > "$out/ipc-tests.log" 2>&1
grep -E "gives|^FAILED|^ERROR|passed|failed" "$out/ipc-tests.log" | tail -25
grep -E "^E  " "$out/ipc-tests.log" | head -30
echo "== bench"
timeout 300 python3 benchmarks/run.py --only ipc > "$out/bench-ipc.log" 2>&1
tail -24 "$out/bench-ipc.log"
echo "== stress (32 clients, 30 s)"
PYSTROM_STRESS_SECONDS=30 timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -s \
  tests/test_store_stress.py > "$out/stress.log" 2>&1
grep -E "stress|device memory|passed|failed|^E  " "$out/stress.log" | head -20
