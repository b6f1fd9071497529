#!/usr/bin/env bash
# Build asyncmr on a CUDA host that has no package registry and run every GPU check.
#
#   ci/gpu.sh OUTDIR [STAGE...]
#
# Stages (default: build cpp pytest demo): build, cpp (GoogleTest via ctest), pytest (all
# Python tests), demo, bench (benchmark into OUTDIR/bench; quick unless BENCH_ARGS is set),
# memcheck (compute-sanitizer memcheck over the Python suite), racecheck (over the C++ tests;
# needs cpp), sanitizer (both),
# soak (long stress run; ASYNCMR_STRESS_SECONDS, default 240).
# Needs, in the repository: .whl/core/*.whl (../shared/wheelhouse.sh .whl core) and, for the
# C++ tests, GoogleTest sources in .gtest (a copy of /usr/src/googletest).
# Logs: OUTDIR/gpu.log (everything, in order) and one file per stage that writes one.
set -uo pipefail
out=$(realpath -m "${1:?usage: ci/gpu.sh OUTDIR [STAGE...]}")
shift
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build cpp pytest demo)
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
mkdir -p "$out"
log=$out/gpu.log
status=0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

say() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$log"; }
run() {  # run NAME CMD...: tee into the log, remember failures
  local name=$1; shift
  say "$name: $*"
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  say "$name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

say "host"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 --version; cmake --version | head -1; nvcc --version | tail -1; } 2>&1 | tee -a "$log"

# Dependencies from the wheelhouse, then the project itself.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .whl/core/*.whl 2>&1 | tee -a "$log"
export PYTHONPATH=/tmp/site
if has build; then
  run build python3 -m pip install --no-build-isolation --no-deps -q . || { echo "build failed"; exit 1; }
fi

if has cpp; then
  run cpp-configure cmake -S . -B build/cpp -G Ninja -DASYNCMR_BUILD_PYTHON=OFF \
    -DASYNCMR_BUILD_TESTS=ON -DASYNCMR_BUILD_BENCHMARKS=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release \
    -DASYNCMR_GTEST_SOURCE_DIR="$repo/.gtest" \
    "-DCMAKE_PREFIX_PATH=/tmp/site/librmm;/tmp/site/rapids_logger" >/dev/null \
  && run cpp-build cmake --build build/cpp -j 16 \
  && run ctest ctest --test-dir build/cpp --output-on-failure -j 4
fi

if has pytest; then
  run pytest python3 -m pytest tests -q -rs -p no:cacheprovider
fi

if has demo; then
  run demo python3 -m asyncmr demo
fi

if has bench; then
  floor=build/cpp/benchmarks/cpp/pool_floor
  # BENCH_ARGS="" runs the full benchmark (a few minutes); the default is the quick one.
  run bench python3 -m asyncmr bench ${BENCH_ARGS---quick} --out "$out/bench" --floor-bin "$floor"
fi

if has sanitizer || has memcheck; then
  # Some tests make CUDA calls fail on purpose (bad input, out of memory): those API errors
  # are expected, so memcheck reports memory errors only. Short stress and capture settings
  # keep the instrumented run inside the time limit. The PyTorch and Numba cases are left
  # out: their children would instrument those libraries' own kernels, not asyncmr.
  ASYNCMR_UNDER_SANITIZER=1 ASYNCMR_STRESS_OPS=300 ASYNCMR_CAPTURE_CYCLES=200 \
    run memcheck compute-sanitizer \
    --tool memcheck --report-api-errors no --error-exitcode 9 --target-processes all \
    python3 -m pytest tests -q -rs -p no:cacheprovider -m "not soak" \
    --ignore tests/test_integrations.py
fi
if has sanitizer || has racecheck; then
  if [ -x build/cpp/tests/cpp/asyncmr_tests ]; then
    run racecheck compute-sanitizer --tool racecheck --error-exitcode 9 \
      build/cpp/tests/cpp/asyncmr_tests
  else
    say "racecheck: no build/cpp/tests/cpp/asyncmr_tests (add the cpp stage)"; status=1
  fi
fi

if has soak; then
  ASYNCMR_SOAK=1 ASYNCMR_STRESS_SECONDS=${ASYNCMR_STRESS_SECONDS:-240} \
    run soak python3 -m pytest tests/reliability -q -rs -s -m soak -p no:cacheprovider
fi

say "done: status $status"
exit $status
