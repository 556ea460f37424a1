#!/usr/bin/env bash
# Everything one call on the GPU machine should do, in one go (device time is scarce):
#   bash .gpu/run bash benchmarks/gpu_session.sh [--quick]
# GPU tests, then the whole suite (every test that runs on both backends compares them; not with
# --quick), the demo on the GPU, and the benchmark table. Logs land in $OUT (the device tool brings them back).
set -uo pipefail
out=${OUT:-/tmp/pystrom-out}
mkdir -p "$out"
quick=${1:-}
python3 - <<'PY'
import cupy, numpy, pyarrow
print("cupy", cupy.__version__, "numpy", numpy.__version__, "pyarrow", pyarrow.__version__,
      "gpus", cupy.cuda.runtime.getDeviceCount())
PY
# Without Jupyter on the image, tests/test_notebooks.py runs the notebooks' cells in plain Python.
echo "== pytest -m gpu"
python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="-ra" 2>&1 | tee "$out/gpu-tests.log" | tail -25
if [ "$quick" != "--quick" ]; then
  echo "== pytest (all)"
  python3 -m pytest -q -p no:cacheprovider 2>&1 | tee "$out/all-tests.log" | tail -4
fi
echo "== pystrom demo"
python3 -m pystrom demo 2>&1 | tee "$out/demo.log" | tail -30
echo "== benchmarks"
python3 benchmarks/run.py $quick 2>&1 | tee "$out/bench.log"
echo "== pystrom.dask with two workers sharing the GPU"
PYSTROM_BENCH_DASK_WORKERS=2 python3 benchmarks/run.py $quick --only dask 2>&1 | tee "$out/bench-dask-2workers.log"
