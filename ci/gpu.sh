#!/usr/bin/env bash
# Build asyncmr on a CUDA host that has no package registry and run every GPU check.
#
#   ci/gpu.sh OUTDIR [STAGE...]
#
# Stages (default: build cpp consumer pytest demo), run in this order whatever order they are
# given in:
#   build     asyncmr-cu13 from source into the system site (CUDA headers and static runtime
#             from the wheels in .whl/build), checked: its name, its CUDA major, and
#             ci/check_build.py (no toolkit file in the build; libasyncmr.so holds the runtime;
#             every extension module links the installed package's one libasyncmr.so)
#   cpp       the GoogleTest suite (ctest), CUDA 13
#   consumer  the C++ package installed with `cmake --install`, tests/cpp/consumer built against
#             it and run (allocates through rmm::device_async_resource_ref from each resource)
#   pytest    the whole Python suite (PYTEST_PATHS: some test files or node ids instead)
#   demo      python -m asyncmr demo, recording the owned pool's history into OUTDIR
#             (demo-history.json, demo-timeline.png: the README's timeline picture)
#   bench     the benchmark into OUTDIR/bench (quick unless BENCH_ARGS is set; needs cpp)
#   memcheck  compute-sanitizer memcheck over the Python suite (MEMCHECK_SHARD=K/N: the K-th of N
#             shares of its test files, for hosts that limit one command's time: the second
#             of 2 shares can run past 10 minutes; the shadow model's four threads stall
#             under memcheck where one thread ends in seconds, so it runs one thread of 300,
#             its patterns over 16 KiB, then four threads of 60 with release_gil="always")
#   tsan      the C++ suite built with ThreadSanitizer (-DASYNCMR_SANITIZE=thread) and run
#   sanitizer memcheck and tsan
#   cu12      asyncmr-cu12 built from source into its own site (/tmp/site12, never mixed with
#             the CUDA 13 one), checked as in build, then the whole Python suite (CU12_TESTS:
#             some test paths instead) and the C++ suite (CU12_CPP=0: not) against it (CuPy:
#             the host's cupy-cuda13x, which talks to the same driver); like pytest, the whole
#             suite needs cpp for the benchmark programs' tests
#   cache     the stress, capture and lifetime suites and the front-cache tests again, with every
#             resource they make behind a 64 MiB front cache (ASYNCMR_TEST_CACHE)
#   cachecheck compute-sanitizer memcheck over that same run
#   cudf      libcudf and pylibcudf (CUDF_WHEELS, default /tmp/big: ../shared/bigcarry.sh puts
#             them there) installed before the build, so asyncmr._cudf is built; then
#             tests/test_cudf.py must run (ASYNCMR_REQUIRE_CUDF=1) and examples/cudf_pinned is
#             built against the installed C++ package (needs consumer) and run
#   stacks    cudf.pandas and cuML on asyncmr (cuDF's wheels installed as for cudf, whose tests
#             it leaves to that stage; cuML's wheels go in CUDF_WHEELS with cuDF's):
#             tests/test_cudf_pandas.py and tests/test_cuml.py (ASYNCMR_REQUIRE_CUML=1 when cuML
#             is installed; STACKS_PYTEST=0: not, for a second bench on a warm host), then
#             benchmark section 13 into OUTDIR/bench-stacks.json (STACKS_BENCH_ARGS, default
#             --quick). LD_LIBRARY_PATH: the site's nvidia/cu13/lib
#             first (cuML's libcuvs needs an nvJitLink >= 13.3: carry nvidia-nvjitlink), then
#             every */lib64 of the site; STACKS_PYTHONPATH (e.g. a carried numpy < 2.5, which
#             cuDF's numba-cuda needs) goes before the site on PYTHONPATH
#   soak      long stress run (ASYNCMR_STRESS_SECONDS, default 240)
#   probe     ci/probes/pointer_facts.cu built with the host's nvcc and run: the driver facts the
#             front cache's ownership rules rely on (docs/DRIVER_FACTS.md); then
#             ci/probes/managed_facts.cu: every cudaMemAdvise kind on managed pool memory; then
#             ci/probes/pool_destroy_facts.cu: a pool's counters while a free is queued, and what
#             destroying it then does to the stream; then ci/probes/marker_facts.cu: what a
#             put's marker costs (cuEventRecord against stream memory writes) and how a write
#             orders; then ci/probes/legacy_facts.cu: whether an event on a blocking stream
#             follows the legacy stream's earlier work, also while another stream captures (it
#             does, but not a blocking stream's: a legacy-stream put still records its marker); then ci/probes/discard_facts.cu:
#             what a discard of part of a page does to the bytes around it, and what discarding
#             at allocation saves over a prefetch; then ci/probes/reserve_facts.cu: what growing
#             a pool up front costs and buys a first pass; then ci/probes/access_facts.cu: what
#             cudaMemPoolSetAccess does with a pool's own device given less than read-write and
#             a device named twice; then ci/probes/retire_facts.cu: created pools of each kind
#             retired after stream-ordered use (prefetches, a fresh stream destroyed before or
#             after the pool, destroyed on a second thread); then ci/probes/reuse_facts.cu: the
#             last-prefetch location a managed pool reports for memory it hands out again;
#             then ci/probes/sync_facts.cu: what a device synchronization on one thread does to
#             a capture on another; then ci/probes/race_facts.cu: which calls on one thread
#             race a managed pool's create, trim or destroy on another. PROBES (default "pointer
#             managed destroy marker legacy discard reserve access retire reuse sync race")
#             picks among them
#   before    the defect tests on the code before their fix: BEFORE_TAR (default
#             .before/tree.tar, made here with `git archive -o .before/tree.tar <commit>`; the
#             tree must hold the tests) is built into its own site and its soundness tests run
#             there (BEFORE_TESTS, default tests/test_cache_soundness.py tests/test_ipc.py: paths,
#             split at spaces; BEFORE_K: a pytest -k expression, kept whole), Python
#             and C++ (BEFORE_CPP=0: Python only); BEFORE_TESTS=none only builds it (for compare). Their failures are the
#             evidence the tests can fail: logged, and they do not fail the run
#   compare   the pair costs (benchmark section 1, quick; COMPARE_SECTIONS=1,11 adds the front
#             cache's) of the code before (the build the before stage made) and of this build,
#             measured by this tree's harness in one run, alternating before/after
#             COMPARE_ROUNDS times (default 2); benchmarks/compare_builds.py prints them side by
#             side as ratios, raw and against RMM's CudaAsyncMemoryResource in the same run, into
#             the log and OUTDIR/compare.json (which holds every run's value of every cell)
#             (needs before and build)
#
# Needs, in the repository:
#   .whl/core/*.whl   ../shared/wheelhouse.sh .whl core       (rmm, librmm for CUDA 13)
#   .whl/build/       ci/build_wheels.sh .whl                  (rapids-build-backend and what it
#                     imports; the CUDA 13 runtime and crt wheels; the CUDA 12 crt headers)
#   .whl/cu12/*.whl   ../shared/wheelhouse.sh .whl cu12       (for the cu12 stage)
#   .whl/dask/*.whl   ../shared/wheelhouse.sh .whl dask       (optional: installed into the core
#                     site when present, for the Dask tests)
#   .gtest/           a copy of /usr/src/googletest           (for cpp, tsan, cu12)
# Every pytest run sees ASYNCMR_REQUIRE_GPUS=<GPUs nvidia-smi lists>: there, a test that skips
# for want of a GPU fails instead. Everything is logged, in order, to OUTDIR/gpu.log (the one log
# file: a host returns few files); the exit status is 0 only if every stage passed.
set -uo pipefail
out=$(realpath -m "${1:?usage: ci/gpu.sh OUTDIR [STAGE...]}")
shift
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build cpp consumer pytest demo)
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
mkdir -p "$out"
log=$out/gpu.log
status=0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# The builds take CUDA from the wheels (cmake/asyncmr_cuda_wheel.cmake): nothing may point them
# elsewhere.
unset CUDAToolkit_ROOT CUDACXX

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
fail() { say "$1: FAILED: $2"; status=1; }
has() {
  local s
  for s in "${stages[@]}"; do
    [ "$s" = "$1" ] && return 0
    [ "$s" = sanitizer ] && { [ "$1" = memcheck ] || [ "$1" = tsan ]; } && return 0
  done
  return 1
}
for s in "${stages[@]}"; do
  case $s in
    build|cpp|consumer|pytest|demo|bench|memcheck|tsan|sanitizer|cu12|cudf|stacks|cache|cachecheck|soak|probe|before|compare) ;;
    *) echo "unknown stage: $s" >&2; exit 2 ;;
  esac
done

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
export ASYNCMR_REQUIRE_GPUS=$gpus
say "host: $gpus GPU(s); stages: ${stages[*]}"
# The Python suites test the benchmark's C++ programs (the floor library, cache_bench) that the
# cpp stage builds; on a GPU host their skips are failures (seen: 5 in a "build tsan cu12" run).
if { has pytest || has cu12; } && ! has cpp; then
  say "note: pytest/cu12 without cpp: the tests of the benchmark's C++ programs will fail (add cpp)"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 --version; cmake --version | head -1; nvcc --version | tail -1; } 2>&1 | tee -a "$log"

# ---- the sites the builds and tests import from --------------------------------------------
# /tmp/site: CUDA 13 (rmm, librmm, the CUDA 13 runtime and crt wheels, Dask when carried).
# /tmp/site-build: the PEP 517 backend (rapids-build-backend and its imports), for builds only.
# /tmp/site12: CUDA 12 (and Dask when carried), filled by the cu12 stage. No site holds two
# CUDA majors.
# ASYNCMR_GPU_SITES moves all three (tests/test_ci_guards.py runs this script on a scratch tree).
sites=${ASYNCMR_GPU_SITES:-/tmp}
site=$sites/site site_build=$sites/site-build site12=$sites/site12
core_wheels=(.whl/core/*.whl)
build_wheels=(.whl/build/*.whl)
[ -e "${core_wheels[0]}" ] || { fail setup "no .whl/core/*.whl (../shared/wheelhouse.sh .whl core)"; exit 1; }
[ -e "${build_wheels[0]}" ] || { fail setup "no .whl/build/*.whl (ci/build_wheels.sh .whl)"; exit 1; }
cuda13=(); other_build=()
for w in "${build_wheels[@]}"; do
  case ${w##*/} in nvidia_cuda_runtime-*|nvidia_cuda_crt-*) cuda13+=("$w") ;; *) other_build+=("$w") ;; esac
done
dask=()
compgen -G '.whl/dask/*.whl' >/dev/null && dask=(.whl/dask/*.whl)
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade "$@"; }
# cuDF's wheels (cudf stage) go in with the others, in one pip call: a later --target install
# replaces the shared nvidia/ folder, and the CUDA 13 runtime headers with it.
cudf_wheels=()
if has cudf || has stacks; then
  cudf_wheels=("${CUDF_WHEELS:-/tmp/big}"/*.whl)
  if [ ! -e "${cudf_wheels[0]}" ]; then
    fail cudf "no wheels in ${CUDF_WHEELS:-/tmp/big} (../shared/wheelhouse.sh .whl cudf, carried with bigcarry.sh)"
    cudf_wheels=()
  fi
fi
# Each run starts from empty sites: a warm host keeps /tmp, and a site an earlier run filled with
# cuDF's wheels kept their metadata after a --target install replaced the nvidia/ folder under
# them (libcudf's CMake entry point then named a module that was gone, and the build failed).
rm -rf "${site:?}" "${site_build:?}"
run setup-site pipi --target "$site" "${core_wheels[@]}" "${cuda13[@]}" "${dask[@]}" \
  "${cudf_wheels[@]}" || { fail setup "the wheels did not install into $site"; exit 1; }
run setup-build-site pipi --target "$site_build" "${other_build[@]}" \
  || { fail setup "the build backend did not install into $site_build"; exit 1; }
export PYTHONPATH=$site
# libcudf is in the site before the build, so CMake finds it and builds asyncmr._cudf; then the
# cuDF tests must run, in every pytest stage.
[ ${#cudf_wheels[@]} -gt 0 ] && export ASYNCMR_REQUIRE_CUDF=1

# lib_dirs PATTERN...: the folders matching each glob PATTERN under each entry of Python's path,
# in that order (PYTHONPATH, the carried wheels, before the host's venv), joined with ':'.
lib_dirs() {
  python3 - "$@" <<'EOF'
import glob, os, sys
found = [d for p in sys.path for pat in sys.argv[1:] for d in sorted(glob.glob(os.path.join(p or ".", pat)))]
print(":".join(dict.fromkeys(found)))
EOF
}

# check_variant NAME MAJOR PYTHONPATH: the asyncmr imported there is asyncmr-cu<MAJOR> and
# links the CUDA <MAJOR> runtime, its build (build/cu<MAJOR>-*) used the wheels only, and every
# extension module of the installed package links its one libasyncmr.so (ldd, in the log).
check_variant() {
  local name=$1 major=$2 path=$3 dir pkg
  run "$name-check" env PYTHONPATH="$path" python3 -c "
import importlib.metadata as md, asyncmr
names = sorted(d.metadata['Name'] for d in md.distributions()
               if d.metadata['Name'].startswith('asyncmr'))
print('asyncmr', asyncmr.__file__, 'runtime', asyncmr.runtime_version(), 'distributions', names)
assert 'asyncmr-cu$major' in names, names
assert asyncmr.runtime_version() // 1000 == $major, 'not the CUDA $major build'
" || return 1
  dir=$(ls -d build/cu"$major"-* 2>/dev/null | head -1)
  pkg=$(PYTHONPATH="$path" python3 -c 'import asyncmr, os; print(os.path.dirname(asyncmr.__file__))')
  run "$name-check-build" python3 ci/check_build.py "${dir:-build/cu$major-missing}" --cuda "$major" \
    --package "$pkg"
}

# cpp_suite NAME BUILD_DIR SITE [CMAKE_ARG...]: configure, build and run the GoogleTest suite
# against the rmm in SITE. The test kernels are built by the host's nvcc into a fatbin and
# loaded through the driver API, so the same nvcc serves the CUDA 12 and 13 builds.
cpp_suite() {
  local name=$1 dir=$2 where=$3
  shift 3
  # The system compiler where there is one: the host's /opt/gcc toolchain (CMake's default there)
  # links its own libstdc++ into libasyncmr.so statically, where the tests that replace
  # operator new cannot reach it (BlockCacheStale's no-host-memory tests failed so).
  local cxx=()
  [ -x /usr/bin/g++ ] && cxx=(-DCMAKE_CXX_COMPILER=/usr/bin/g++)
  run "$name-configure" env PYTHONPATH="$where" cmake -S . -B "$dir" -G Ninja "${cxx[@]}" \
    -DASYNCMR_BUILD_PYTHON=OFF -DASYNCMR_BUILD_TESTS=ON -DASYNCMR_TEST_CUDA_ARCHITECTURES=90 \
    -DASYNCMR_GTEST_SOURCE_DIR="$repo/.gtest" -DASYNCMR_TEST_NVCC="$(command -v nvcc)" \
    -DPython3_EXECUTABLE="$(command -v python3)" \
    "-DCMAKE_PREFIX_PATH=$where/librmm;$where/rapids_logger" "$@" \
  && run "$name-build" cmake --build "$dir" -j 16 \
  && run "$name" ctest --test-dir "$dir" --output-on-failure -j 4 \
       --output-junit "/tmp/$name-junit.xml" \
  && { [ "$gpus" -eq 0 ] || run "$name-skips" python3 ci/check_skips.py "/tmp/$name-junit.xml"; }
}

# ---- build: asyncmr-cu13 --------------------------------------------------------------------
if has build; then
  run build env PYTHONPATH="$site:$site_build" python3 -m pip install --no-build-isolation \
    --no-deps -q . || { fail build "asyncmr-cu13 did not build or install"; exit 1; }
  check_variant build 13 "$site"
fi

# ---- cpp: the C++ suite, CUDA 13 --------------------------------------------------------------
if has cpp; then
  cpp_suite cpp build/cpp "$site" -DASYNCMR_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
fi

# ---- consumer: find_package(asyncmr) from an installed package --------------------------------
if has consumer; then
  prefix=$repo/build/consumer-prefix
  rm -rf "$prefix"
  if run consumer-library cmake -S . -B build/consumer-lib -G Ninja -DASYNCMR_BUILD_PYTHON=OFF \
       -DPython3_EXECUTABLE="$(command -v python3)" \
       "-DCMAKE_PREFIX_PATH=$site/librmm;$site/rapids_logger" \
     && run consumer-library-build cmake --build build/consumer-lib -j 16 \
     && run consumer-install cmake --install build/consumer-lib --prefix "$prefix" \
     && run consumer-configure cmake -S tests/cpp/consumer -B build/consumer -G Ninja \
       -DPython3_EXECUTABLE="$(command -v python3)" \
       "-DCMAKE_PREFIX_PATH=$prefix;$site/librmm;$site/rapids_logger" \
     && run consumer-build cmake --build build/consumer; then
    say "consumer: build/consumer/asyncmr_consumer"
    build/consumer/asyncmr_consumer 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 77 ] && [ "$gpus" -eq 0 ]; then
      say "consumer: no GPU here, not run"
    elif [ "$rc" -ne 0 ]; then
      fail consumer "exit $rc"
    else
      say "consumer: exit 0"
    fi
  fi
fi

# ---- Python suite, demo, benchmark (CUDA 13) --------------------------------------------------
if has pytest; then
  # A hang (its stacks are in the log after faulthandler_timeout) must not take the later
  # stages with it: the suite takes a few minutes on one GPU.
  # PYTEST_PATHS (default tests): some files or node ids, for a short window of device time.
  # shellcheck disable=SC2086
  run pytest timeout -k 10 "${PYTEST_TIMEOUT:-480}" python3 -m pytest ${PYTEST_PATHS:-tests} -q -rs \
    -p no:cacheprovider
fi

if has demo; then
  run demo python3 -m asyncmr demo --history "$out"
fi

if has bench; then
  floor=build/cpp/benchmarks/cpp/pool_floor
  # BENCH_ARGS="" runs the full benchmark (a few minutes); the default is the quick one. A
  # benchmark that exits non-zero fails the stage (run records it).
  # The host returns at most 8 files: the results stay in /tmp, their JSON comes back (the
  # plots are drawn from it: PYTHONPATH=benchmarks python -m asyncmr_bench.plots RESULTS.json).
  run bench python3 -m asyncmr bench ${BENCH_ARGS---quick} --out /tmp/bench-cu13 --floor-bin "$floor"
  cp /tmp/bench-cu13/results.json "$out/bench-cu13.json" 2>/dev/null
fi

# ---- sanitizers -------------------------------------------------------------------------------
if has memcheck; then
  # Some tests make CUDA calls fail on purpose (bad input, out of memory): those API errors
  # are expected, so memcheck reports memory errors only. Short stress and capture settings
  # keep the instrumented run inside the time limit. Left out: the PyTorch and Numba cases,
  # Dask clusters, cuDF, info and the benchmark's tests, whose children would instrument those
  # libraries' own kernels and processes, not asyncmr.
  # MEMCHECK_SHARD=K/N runs the K-th of N shares of the test files (every N-th, sorted), for a
  # host that limits one command's time: the whole instrumented suite takes longer than 10 min.
  memcheck_files=()
  for f in tests/reliability/test_*.py tests/test_*.py; do
    case ${f##*/} in
      test_integrations.py|test_dask.py|test_cudf.py|test_info.py|test_benchmarks.py) ;;
      *) memcheck_files+=("$f") ;;
    esac
  done
  shard=${MEMCHECK_SHARD:-1/1}
  k=${shard%/*} n=${shard#*/}
  picked=()
  if ! [[ $k =~ ^[0-9]+$ && $n =~ ^[0-9]+$ ]] || [ "$k" -lt 1 ] || [ "$k" -gt "$n" ]; then
    fail memcheck "MEMCHECK_SHARD must be K/N with 1 <= K <= N, got '$shard'"
  else
    for i in "${!memcheck_files[@]}"; do
      [ $((i % n)) -eq $((k - 1)) ] && picked+=("${memcheck_files[$i]}")
    done
    say "memcheck: share $shard, ${#picked[@]} of ${#memcheck_files[@]} test files"
  fi
  # A test that outlives MEMCHECK_TEST_TIMEOUT (default 300 s; pytest-timeout, on the host) fails
  # with its stack and the rest go on: one slow test must not spend the share.
  per_test=()
  python3 -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout "${MEMCHECK_TEST_TIMEOUT:-300}")
  # The cache model runs on one thread in the share: under memcheck its four threads stop
  # making progress within a minute (three in CuPy kernel launches, one in a front-cache free),
  # where one thread ends in seconds. With every resource's release_gil="always" four threads
  # end in seconds too: what stalls is the GIL a free holds across its driver calls ("auto"),
  # which the sanitizer makes long. So the model's threads run under memcheck that way, after
  # the share.
  mc=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9
      --target-processes all python3 -m pytest -q -rs -p no:cacheprovider)
  [ ${#picked[@]} -gt 0 ] && ASYNCMR_UNDER_SANITIZER=1 ASYNCMR_STRESS_OPS=300 ASYNCMR_MODEL_OPS=300 \
    ASYNCMR_MODEL_THREADS=1 \
    ASYNCMR_CAPTURE_CYCLES=200 run memcheck "${mc[@]}" "${picked[@]}" -m "not soak" "${per_test[@]}"
  model=tests/reliability/test_reliability_cache_model.py
  case " ${picked[*]} " in
    *" $model "*) ASYNCMR_UNDER_SANITIZER=1 ASYNCMR_MODEL_OPS=60 ASYNCMR_MODEL_THREADS=4 \
        ASYNCMR_MODEL_RELEASE_GIL=always run memcheck-model-threads "${mc[@]}" "$model" \
        "${per_test[@]}" ;;
  esac
fi

if has tsan; then
  # ThreadSanitizer over the C++ suite: the library and the tests are instrumented; the CUDA
  # runtime and driver are not, so races inside them go unseen, and reports from the driver's
  # own threads are dropped (ignore_noninstrumented_modules). No suppressions: a report is a
  # finding. Its exit status is 66 when it reported anything. ASLR off (setarch -R): older TSan
  # runtimes cannot map their shadow under a kernel's high mmap randomization.
  if run tsan-configure cmake -S . -B build/tsan -G Ninja -DASYNCMR_BUILD_PYTHON=OFF \
       -DASYNCMR_BUILD_TESTS=ON -DASYNCMR_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DASYNCMR_TEST_CUDA_ARCHITECTURES=90 -DASYNCMR_GTEST_SOURCE_DIR="$repo/.gtest" \
       -DASYNCMR_TEST_NVCC="$(command -v nvcc)" -DPython3_EXECUTABLE="$(command -v python3)" \
       "-DCMAKE_PREFIX_PATH=$site/librmm;$site/rapids_logger" \
     && run tsan-build cmake --build build/tsan -j 16; then
    norand=()
    setarch "$(uname -m)" -R true 2>/dev/null && norand=(setarch "$(uname -m)" -R)
    run tsan env TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 ignore_noninstrumented_modules=1" \
      "${norand[@]}" build/tsan/tests/cpp/asyncmr_tests --gtest_brief=1
  fi
fi

# ---- cu12: asyncmr-cu12 in its own site --------------------------------------------------------
if has cu12; then
  rm -rf "${site12:?}"  # from empty, as the other sites
  cu12_wheels=(.whl/cu12/*.whl)
  if [ ! -e "${cu12_wheels[0]}" ] || [ ! -e .whl/build/cuda12-crt.tar.gz ]; then
    fail cu12 "needs .whl/cu12/*.whl (../shared/wheelhouse.sh .whl cu12) and .whl/build/cuda12-crt.tar.gz (ci/build_wheels.sh .whl)"
  elif ! run cu12-site pipi --target "$site12" "${cu12_wheels[@]}" "${dask[@]}" \
       || ! run cu12-crt tar -xzf .whl/build/cuda12-crt.tar.gz -C "$site12"; then
    fail cu12 "the CUDA 12 wheels did not install into $site12"
  elif ! run cu12-build env PYTHONPATH="$site12:$site_build" python3 -m pip install \
         --no-build-isolation --no-deps -q --target "$site12" --upgrade \
         -C rapidsai.matrix-entry=cuda=12.9 .; then
    fail cu12 "asyncmr-cu12 did not build or install"
  else
    check_variant cu12 12 "$site12"
    # No cuDF in the CUDA 12 site (the cudf stage carries cuDF's CUDA 13 wheels), so its cuDF
    # tests do not apply there: the cudf stage's ASYNCMR_REQUIRE_CUDF is for the CUDA 13 site.
    # CU12_TESTS (default: the whole suite) narrows the run to some test paths; CU12_CPP=0
    # leaves the C++ suite out (for a round that checks a few tests within a host's time limit).
    # shellcheck disable=SC2086
    run cu12-pytest env -u ASYNCMR_REQUIRE_CUDF PYTHONPATH="$site12" python3 -m pytest \
      ${CU12_TESTS:-tests} -q -rs -p no:cacheprovider
    [ "${CU12_CPP:-1}" = 0 ] || cpp_suite cu12-cpp build/cpp12 "$site12" -DCMAKE_BUILD_TYPE=Release
    if has bench; then
      # The pair costs of the CUDA 12 build (created pinned pool vs the default one), beside
      # the CUDA 13 build's (BENCH12_ARGS, default the quick section 1).
      run cu12-bench env PYTHONPATH="$site12" python3 -m asyncmr bench ${BENCH12_ARGS---quick --sections 1} \
        --out /tmp/bench-cu12 --floor-bin build/cpp/benchmarks/cpp/pool_floor
      cp /tmp/bench-cu12/results.json "$out/bench-cu12.json" 2>/dev/null
    fi
  fi
fi

# ---- cache: the reliability suites behind a front cache ------------------------------------------
cache_tests=(tests/reliability/test_reliability_stress.py tests/reliability/test_reliability_capture.py
             tests/reliability/test_reliability_lifetimes.py tests/test_front_cache.py)
if has cache; then
  ASYNCMR_TEST_CACHE=$((64 << 20)) run cache python3 -m pytest "${cache_tests[@]}" -q -rs \
    -p no:cacheprovider -m "not soak"
fi
if has cachecheck; then
  ASYNCMR_TEST_CACHE=$((64 << 20)) ASYNCMR_UNDER_SANITIZER=1 ASYNCMR_STRESS_OPS=300 \
    ASYNCMR_CAPTURE_CYCLES=200 run cachecheck compute-sanitizer \
    --tool memcheck --report-api-errors no --error-exitcode 9 --target-processes all \
    python3 -m pytest "${cache_tests[@]}" -q -rs -p no:cacheprovider -m "not soak"
fi

# ---- cudf: asyncmr's pinned pool as libcudf's pinned resource ----------------------------------
if has cudf && [ -n "${ASYNCMR_REQUIRE_CUDF:-}" ]; then
  run cudf-pytest python3 -m pytest tests/test_cudf.py -q -rs -p no:cacheprovider
  prefix=$repo/build/consumer-prefix
  if [ ! -d "$prefix" ]; then
    fail cudf "examples/cudf_pinned needs the installed C++ package (add the consumer stage)"
  # The system compiler: libcudf's wheel runs on the system libstdc++, and a toolchain with a
  # libstdc++ of its own (the host's /opt/gcc, which CMake otherwise picks as c++) made libcudf
  # abort in std::locale's destructor (free(): invalid pointer).
  elif run cudf-example-configure cmake -S examples/cudf_pinned -B build/cudf_pinned -G Ninja \
         -DCMAKE_CXX_COMPILER="$(command -v g++)" -DPython3_EXECUTABLE="$(command -v python3)" \
         "-DCMAKE_PREFIX_PATH=$prefix;$site/libcudf;$site/librmm;$site/rapids_logger" \
       && run cudf-example-build cmake --build build/cudf_pinned -j 16; then
    # libcudf.so and the libraries it needs, from the wheels on the Python path.
    ldpath=$(lib_dirs libcudf/lib64 libkvikio/lib64 librmm/lib64 rapids_logger/lib64 \
      nvidia/libnvcomp/lib64 nvidia/cu13/lib 'nvidia/*/lib')
    if ! run cudf-example env LD_LIBRARY_PATH="$ldpath:${LD_LIBRARY_PATH:-}" \
         build/cudf_pinned/cudf_pinned && command -v cuda-gdb >/dev/null; then
      # Where it stopped, for the log.
      env LD_LIBRARY_PATH="$ldpath:${LD_LIBRARY_PATH:-}" cuda-gdb -batch -ex run -ex bt \
        build/cudf_pinned/cudf_pinned 2>&1 | tail -40 | tee -a "$log"
    fi
  fi
fi

if has stacks; then
  if [ -z "${ASYNCMR_REQUIRE_CUDF:-}" ]; then
    fail stacks "needs cuDF's wheels (and cuML's for the cuML half) in ${CUDF_WHEELS:-/tmp/big}"
  else
    stack_path=${STACKS_PYTHONPATH:+$STACKS_PYTHONPATH:}$site
    stack_ld=$(PYTHONPATH=$stack_path lib_dirs nvidia/cu13/lib '*/lib64' 'nvidia/*/lib64')
    stack_env=(PYTHONPATH="$stack_path" LD_LIBRARY_PATH="$stack_ld:${LD_LIBRARY_PATH:-}")
    if env "${stack_env[@]}" python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("cuml") is None)'; then
      stack_env+=(ASYNCMR_REQUIRE_CUML=1)
    fi
    if [ "${STACKS_PYTEST:-1}" != 0 ]; then
      run stacks-pytest env "${stack_env[@]}" python3 -m pytest tests/test_cudf_pandas.py \
        tests/test_cuml.py -q -rs -p no:cacheprovider
    fi
    run stacks-bench env "${stack_env[@]}" python3 -m asyncmr bench ${STACKS_BENCH_ARGS---quick} \
      --sections 13 --out /tmp/bench-stacks
    cp /tmp/bench-stacks/results.json "$out/bench-stacks.json" 2>/dev/null
  fi
fi

if has probe; then
  probes=${PROBES:-pointer managed destroy marker legacy discard reserve access retire reuse sync race}
  probe_wanted() { [[ " $probes " == *" $1 "* ]]; }
  # run_probe NAME SECONDS [NVCC FLAGS...]: ci/probes/NAME_facts.cu built and run, when PROBES
  # names it.
  run_probe() {
    local name=$1 seconds=$2 binary=/tmp/${1}_facts
    shift 2
    probe_wanted "$name" || return 0
    run "probe-$name-build" nvcc -O2 -std=c++17 -o "$binary" "ci/probes/${name}_facts.cu" "$@" \
      && run "probe-$name" timeout "$seconds" "$binary"
  }
  run_probe pointer 90 -lcuda
  run_probe managed 60
  # The destroy step may never return (that is one answer it can give): a timeout is a fact
  # logged, not a failed stage.
  if probe_wanted destroy; then
    run probe-destroy-build nvcc -O2 -std=c++17 -o /tmp/pool_destroy_facts ci/probes/pool_destroy_facts.cu \
      && run probe-destroy-counters timeout 30 /tmp/pool_destroy_facts \
      && { timeout 20 /tmp/pool_destroy_facts destroy 2>&1 | tee -a "$log"
           rc=${PIPESTATUS[0]}
           if [ "$rc" -eq 124 ]; then say "probe-destroy: the stream never finished (timed out)"
           else say "probe-destroy: exit $rc"; fi; }
  fi
  run_probe marker 120 -lcuda
  run_probe legacy 60 -lcuda
  run_probe discard 120
  run_probe reserve 120
  run_probe access 60
  # Each variant in a process of its own: a crash inside the driver is its answer, logged.
  if probe_wanted retire && run probe-retire-build nvcc -O2 -std=c++17 -o /tmp/retire_facts \
       ci/probes/retire_facts.cu; then
    for variant in "device none" "pinned none" "managed none" "managed device" "managed host"; do
      for words in stream-first pool-first "thread fresh-only max-threshold"; do
        # shellcheck disable=SC2086
        timeout 60 /tmp/retire_facts $variant 100 $words 2>&1 | tail -2 | tee -a "$log"
        say "probe-retire $variant $words: exit ${PIPESTATUS[0]}"
      done
    done
    for kind in device managed; do
      timeout 30 /tmp/retire_facts $kind none 1 settle 2>&1 | tee -a "$log"
    done
    # Which of the second thread's calls the managed pools' crash needs: its trims, or a
    # destroy right after the pool first holds nothing. Each three times: it does not crash
    # every run.
    for words in "" "no-trim" "delay=100" "no-trim delay=100"; do
      for run_index in 1 2 3; do
        # shellcheck disable=SC2086
        timeout 60 /tmp/retire_facts managed device 100 thread fresh-only max-threshold \
          pool-first $words 2>&1 | tail -1 | tee -a "$log"
        say "probe-retire managed device thread pool-first $words (run $run_index): exit ${PIPESTATUS[0]}"
      done
    done
  fi
  run_probe reuse 60
  run_probe sync 60
  if probe_wanted race && run probe-race-build nvcc -O2 -std=c++17 -o /tmp/race_facts \
       ci/probes/race_facts.cu; then
    for pair in "prefetch managed" "prefetch managed-unused" "prefetch managed-keep" \
                "prefetch device" "prefetch pinned" "prefetch-malloc managed-keep" \
                "alloc-free managed-keep" "nothing managed-keep"; do
      # shellcheck disable=SC2086
      timeout 30 /tmp/race_facts $pair 3 2>&1 | tail -2 | tee -a "$log"
      say "probe-race $pair: exit ${PIPESTATUS[0]}"
    done
  fi
fi

if has before; then
  tree=${BEFORE_TAR:-.before/tree.tar}
  if [ ! -f "$tree" ]; then
    fail before "no $tree (git archive -o $tree <commit> where the pool is reachable)"
  else
    rm -rf /tmp/before /tmp/site-before && mkdir -p /tmp/before /tmp/site-before
    tar -xf "$tree" -C /tmp/before
    cp -r .gtest /tmp/before/.gtest 2>/dev/null
    if run before-build env PYTHONPATH="$site:$site_build" python3 -m pip install \
         --no-build-isolation --no-deps -q --target /tmp/site-before /tmp/before; then
      if [ "${BEFORE_TESTS:-}" = none ]; then
        say "before: built; its tests not run (BEFORE_TESTS=none)"
      else
        # Expected to fail: not counted in the status.
        say "before: the soundness tests on the code before the fix (failures expected)"
        (cd /tmp/before && PYTHONPATH="/tmp/site-before:$site" timeout 300 python3 -m pytest \
           ${BEFORE_TESTS:-tests/test_cache_soundness.py tests/test_ipc.py} ${BEFORE_K:+-k "$BEFORE_K"} \
           -q -rs -p no:cacheprovider \
           --timeout 40) 2>&1 | tee -a "$log"
        [ "${BEFORE_CPP:-1}" = 0 ] || (cd /tmp/before && PYTHONPATH="$site" cmake -S . -B build/cpp -G Ninja \
           -DASYNCMR_BUILD_PYTHON=OFF -DASYNCMR_BUILD_TESTS=ON -DASYNCMR_TEST_CUDA_ARCHITECTURES=90 \
           -DASYNCMR_GTEST_SOURCE_DIR=/tmp/before/.gtest -DASYNCMR_TEST_NVCC="$(command -v nvcc)" \
           -DPython3_EXECUTABLE="$(command -v python3)" -DCMAKE_BUILD_TYPE=Release \
           "-DCMAKE_PREFIX_PATH=$site/librmm;$site/rapids_logger" >/dev/null \
           && cmake --build build/cpp -j 16 --target asyncmr_tests >/dev/null \
           && ctest --test-dir build/cpp -R "${BEFORE_CPP_TESTS:-Soundness}" --output-on-failure --timeout 60) 2>&1 | tee -a "$log"
        say "before: done (its failures do not fail this run)"
      fi
    fi
  fi
fi

if has compare; then
  if [ ! -d /tmp/site-before ] || ! has build; then
    fail compare "needs the before and build stages in the same run"
  else
    runs_before=() runs_after=()
    rounds=${COMPARE_ROUNDS:-2}
    [[ $rounds =~ ^[1-9][0-9]?$ ]] || { fail compare "COMPARE_ROUNDS must be 1-99, got '$rounds'"; rounds=0; }
    for i in $(seq 1 "$rounds"); do
      for side in before after; do
        where=$site
        [ "$side" = before ] && where=/tmp/site-before:$site
        run "compare-$side-$i" env PYTHONPATH="$repo/benchmarks:$where" python3 -m asyncmr_bench \
          --quick --sections "${COMPARE_SECTIONS:-1}" --no-floor --out "/tmp/compare-$side-$i"
        if [ "$side" = before ]; then runs_before+=("/tmp/compare-$side-$i/results.json")
        else runs_after+=("/tmp/compare-$side-$i/results.json"); fi
      done
    done
    [ "$rounds" -gt 0 ] && run compare python3 benchmarks/compare_builds.py \
      --before "${runs_before[@]}" --after "${runs_after[@]}" --out "$out/compare.json"
  fi
fi

if has soak; then
  ASYNCMR_SOAK=1 ASYNCMR_STRESS_SECONDS=${ASYNCMR_STRESS_SECONDS:-240} \
    run soak python3 -m pytest tests/reliability -q -rs -s -m soak -p no:cacheprovider
fi

say "done: status $status"
exit $status
