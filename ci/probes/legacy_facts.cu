// Whether a front-cache put on the legacy default stream can skip its marker (ci/gpu.sh probe):
// the legacy stream lives as long as its context, so its order can be taken when a bucket is
// parked instead of at every put, if something the cache may call from any thread, at any time,
// follows every legacy-stream call made before it without touching the legacy stream (work
// there from a background thread would break a capture on any blocking stream). The candidate:
// an event recorded on a *blocking* stream of the cache's own (the witness), which by the
// legacy stream's implicit synchronization waits for the legacy work queued before it.
//   legacy_facts   prints, each against a control that must differ:
//                  - an event on a blocking stream behind a ~200 ms legacy kernel (queued by
//                    this thread, then by another): not ready at once, ready after the kernel;
//                    the same event on a non-blocking stream: ready at once;
//                  - a release stream waiting for that event holds back a cuMemFreeAsync until
//                    the kernel ends;
//                  - while a blocking stream captures (global mode), the witness's record and
//                    the release stream's wait from another thread succeed and the capture ends
//                    valid; a record on the legacy stream itself is refused and breaks it.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

using clk = std::chrono::steady_clock;

static double since_ms(clk::time_point t0)
{
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

static void check(CUresult r, char const* what)
{
  if (r != CUDA_SUCCESS) {
    char const* name = nullptr;
    cuGetErrorName(r, &name);
    std::printf("FAIL %s: %s\n", what, name ? name : "?");
    std::exit(1);
  }
}

static char const* name_of(CUresult r)
{
  char const* name = nullptr;
  cuGetErrorName(r, &name);
  return name ? name : "?";
}

__global__ void spin(long long cycles)
{
  long long const t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

constexpr long long cycles = 400LL * 1000 * 1000;  // ~200 ms at ~2 GHz

static void spin_on_legacy() { spin<<<1, 1, 0, cudaStreamLegacy>>>(cycles); }

// An event recorded on `witness` behind a legacy kernel queued by this thread or another one:
// whether it was ready at once, and when it was.
static void witness_behind_legacy(CUstream witness, char const* what, bool other_thread)
{
  CUevent e{};
  check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  if (other_thread) {
    CUcontext ctx{};
    check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    std::thread t{[ctx] {
      cuCtxSetCurrent(ctx);
      spin_on_legacy();
    }};
    t.join();
  } else {
    spin_on_legacy();
  }
  check(cuEventRecord(e, witness), "cuEventRecord on the witness");
  auto const t0      = clk::now();
  CUresult const at_once = cuEventQuery(e);
  check(cuEventSynchronize(e), "cuEventSynchronize");
  double const ready_ms = since_ms(t0);
  check(cuStreamSynchronize(CU_STREAM_LEGACY), "legacy sync");
  std::printf("event on a %s behind a ~200 ms legacy kernel (%s): at once %s, ready after %.1f ms\n",
              what, other_thread ? "queued by another thread" : "queued by this thread",
              name_of(at_once), ready_ms);
  cuEventDestroy(e);
}

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  check(cuInit(0), "cuInit");
  cudaFree(0);
  int version = 0;
  cuDriverGetVersion(&version);
  std::printf("driver %d\n", version);

  CUstream witness{}, nonblocking{}, release{};
  check(cuStreamCreate(&witness, CU_STREAM_DEFAULT), "cuStreamCreate blocking");
  check(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), "cuStreamCreate non-blocking");
  check(cuStreamCreate(&release, CU_STREAM_NON_BLOCKING), "cuStreamCreate release");

  witness_behind_legacy(witness, "blocking stream", false);
  witness_behind_legacy(witness, "blocking stream", true);
  witness_behind_legacy(nonblocking, "non-blocking stream (control)", false);

  // The release stream's free waits for the witness, which waits for the legacy kernel.
  {
    CUdevice dev{};
    check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
    CUmemoryPool pool{};
    check(cuDeviceGetDefaultMemPool(&pool, dev), "cuDeviceGetDefaultMemPool");
    CUdeviceptr p{};
    check(cuMemAllocFromPoolAsync(&p, 4096, pool, CU_STREAM_LEGACY), "alloc");
    check(cuStreamSynchronize(CU_STREAM_LEGACY), "sync");
    CUevent e{}, done{};
    check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    check(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    spin_on_legacy();
    check(cuEventRecord(e, witness), "record on the witness");
    check(cuStreamWaitEvent(release, e, 0), "release waits");
    check(cuMemFreeAsync(p, release), "free on the release stream");
    check(cuEventRecord(done, release), "record after the free");
    auto const t0          = clk::now();
    CUresult const at_once = cuEventQuery(done);
    check(cuEventSynchronize(done), "sync");
    std::printf("a free on the release stream behind the witness: at once %s, done after %.1f ms\n",
                name_of(at_once), since_ms(t0));
    cuEventDestroy(e);
    cuEventDestroy(done);
  }

  // A capture on a blocking stream, global mode; another thread records on the witness (and,
  // after it, on the legacy stream) in relaxed mode, as the cache's reclaimer does.
  for (int on_legacy = 0; on_legacy < 2; ++on_legacy) {
    CUstream cap{};
    check(cuStreamCreate(&cap, CU_STREAM_DEFAULT), "cuStreamCreate");
    CUdeviceptr d{};
    check(cuMemAlloc(&d, 4096), "cuMemAlloc");
    check(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
    check(cuMemsetD8Async(d, 1, 4096, cap), "memset while capturing");
    CUresult record = CUDA_SUCCESS, wait = CUDA_SUCCESS;
    CUcontext ctx{};
    check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    std::thread t{[&] {
      cuCtxSetCurrent(ctx);
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      cuThreadExchangeStreamCaptureMode(&mode);
      CUevent e{};
      cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
      record = cuEventRecord(e, on_legacy ? CU_STREAM_LEGACY : witness);
      wait   = cuStreamWaitEvent(release, e, 0);
      cuThreadExchangeStreamCaptureMode(&mode);
      cuEventDestroy(e);
    }};
    t.join();
    CUresult const after = cuMemsetD8Async(d, 2, 4096, cap);
    CUgraph g{};
    CUresult const end = cuStreamEndCapture(cap, &g);
    CUgraphExec exec{};
    CUresult const inst = end == CUDA_SUCCESS && g != nullptr
                            ? cuGraphInstantiate(&exec, g, 0)
                            : CUDA_ERROR_INVALID_VALUE;
    std::printf("while a blocking stream captures (global), a record on the %s from another "
                "thread: %s, the release stream's wait %s; the capture's next call %s, end "
                "capture %s, instantiate %s\n",
                on_legacy ? "legacy stream (control)" : "witness", name_of(record), name_of(wait),
                name_of(after), name_of(end), name_of(inst));
    if (exec) { cuGraphExecDestroy(exec); }
    if (g) { cuGraphDestroy(g); }
    cuCtxSynchronize();
    cudaGetLastError();
    cuMemFree(d);
    cuStreamDestroy(cap);
  }
  std::printf("probe done\n");
  return 0;
}
