// Driver facts behind the front cache's ownership rules, printed one per line (ci/gpu.sh probe):
// which pool the driver names for a pointer (pool blocks, graph allocations, other memory),
// the mapped range of a block, the cost of the queries a free may make, and whether a device
// synchronization waits for work queued after it began.
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#define CK(x) do { auto e_ = (x); if (e_ != 0) { printf("FAIL %s = %d at %d\n", #x, (int)e_, __LINE__); } } while (0)
using clk = std::chrono::steady_clock;
static double ns_since(clk::time_point t, int n) { return std::chrono::duration<double, std::nano>(clk::now() - t).count() / n; }

__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }
__global__ void touch(int* p) { if (p) p[0] = 1; }

static void describe(const char* what, void* p) {
  CUmemoryPool pool = nullptr;
  CUresult r = cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)p);
  CUdeviceptr start = 0; size_t size = 0;
  CUresult r2 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)p);
  CUresult r3 = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)p);
  CUdeviceptr base = 0; size_t bsize = 0;
  CUresult r4 = cuMemGetAddressRange(&base, &bsize, (CUdeviceptr)p);
  unsigned int mtype = 0; CUresult r5 = cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)p);
  unsigned long long bufid = 0; CUresult r6 = cuPointerGetAttribute(&bufid, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)p);
  printf("%-34s ptr=%p pool: r=%d %p | range_start r=%d off=%lld size r=%d %zu | addrrange r=%d off=%lld %zu | memtype r=%d %u | bufid r=%d %llu\n",
         what, p, r, (void*)pool, r2, (long long)((char*)p - (char*)start), r3, size, r4,
         (long long)((char*)p - (char*)base), bsize, r5, mtype, r6, bufid);
  cudaGetLastError();
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each fact reaches the log as it is found
  CK(cuInit(0));
  cudaFree(0);
  int drv = 0; cudaDriverGetVersion(&drv); printf("driver %d\n", drv);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t devpool, devpool2, pinpool, manpool;
  cudaMemPoolProps p{}; p.allocType = cudaMemAllocationTypePinned; p.location = {cudaMemLocationTypeDevice, 0};
  CK(cudaMemPoolCreate(&devpool, &p)); CK(cudaMemPoolCreate(&devpool2, &p));
  cudaMemPoolProps hp{}; hp.allocType = cudaMemAllocationTypePinned; hp.location = {cudaMemLocationTypeHost, 0};
  CK(cudaMemPoolCreate(&pinpool, &hp));
  cudaMemPoolProps mp{}; mp.allocType = (cudaMemAllocationType)2; mp.location = {cudaMemLocationTypeDevice, 0};
  CK(cudaMemPoolCreate(&manpool, &mp));
  printf("pools: dev %p dev2 %p pinned %p managed %p\n", devpool, devpool2, pinpool, manpool);
  void *d1, *d2, *h1, *m1, *d3;
  CK(cudaMallocFromPoolAsync(&d1, 1 << 20, devpool, s));
  CK(cudaMallocFromPoolAsync(&d3, 64 << 10, devpool, s));
  CK(cudaMallocFromPoolAsync(&d2, 64 << 10, devpool2, s));
  CK(cudaMallocFromPoolAsync(&h1, 1 << 20, pinpool, s));
  CK(cudaMallocFromPoolAsync(&m1, 1 << 20, manpool, s));
  CK(cudaStreamSynchronize(s));
  describe("device pool 1 MiB", d1);
  describe("device pool 64 KiB (2nd block)", d3);
  describe("device pool interior (+4096)", (char*)d1 + 4096);
  describe("other device pool 64 KiB", d2);
  describe("pinned pool 1 MiB", h1);
  describe("managed pool 1 MiB", m1);
  for (int i = 0; i < 6; ++i) { void* q; CK(cudaMallocFromPoolAsync(&q, 256 + i * 8, pinpool, s)); printf("pinned small %d bytes at %p (mod 256 = %zu)\n", 256 + i * 8, q, (size_t)q % 256); }
  for (int i = 0; i < 4; ++i) { void* q; CK(cudaMallocFromPoolAsync(&q, 1 + i * 100, devpool, s)); printf("device small %d bytes at %p (mod 256 = %zu)\n", 1 + i * 100, q, (size_t)q % 256); }
  void* cm; CK(cudaMalloc(&cm, 1 << 20)); describe("cudaMalloc", cm);
  void* ch; CK(cudaMallocHost(&ch, 1 << 20)); describe("cudaMallocHost", ch);
  void* hm = malloc(1 << 20); describe("malloc", hm);
  void* fa; CK(cudaMallocAsync(&fa, 1 << 20, s)); describe("cudaMallocAsync (default pool)", fa);
  // freed pointer
  void* fr; CK(cudaMallocFromPoolAsync(&fr, 1 << 20, devpool2, s)); CK(cudaFreeAsync(fr, s)); CK(cudaStreamSynchronize(s)); describe("freed pool block (synced)", fr);
  CK(cudaMemPoolTrimTo(devpool2, 0)); describe("freed pool block after trim", fr);
  // graph allocation
  cudaStream_t cs; CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  void* g = nullptr;
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  CK(cudaMallocFromPoolAsync(&g, 1 << 20, devpool, cs));
  cudaGraph_t graph; CK(cudaStreamEndCapture(cs, &graph));
  cudaGraphExec_t exec; CK(cudaGraphInstantiate(&exec, graph, 0));
  printf("graph allocation address %p\n", g);
  describe("graph alloc before launch", g);
  CK(cudaGraphLaunch(exec, cs)); CK(cudaStreamSynchronize(cs));
  describe("graph alloc after launch", g);
  CK(cudaFreeAsync(g, cs)); CK(cudaStreamSynchronize(cs));
  CK(cudaGraphLaunch(exec, cs)); CK(cudaStreamSynchronize(cs));
  describe("graph alloc 2nd launch", g);
  // cudaFreeAsync of a non-graph pointer inside a capture
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  cudaError_t fe = cudaFreeAsync(d3, cs);
  cudaStreamCaptureStatus st; cudaStreamIsCapturing(cs, &st);
  cudaGraph_t g2; cudaError_t ee = cudaStreamEndCapture(cs, &g2);
  printf("cudaFreeAsync(non-graph ptr) in capture: %s; capture status after %d; end capture %s\n", cudaGetErrorName(fe), (int)st, cudaGetErrorName(ee));
  cudaGetLastError();
  CK(cudaFreeAsync(g, cs)); CK(cudaStreamSynchronize(cs));
  // costs
  const int N = 200000;
  CUmemoryPool pl;
  auto t = clk::now(); for (int i = 0; i < N; ++i) cuPointerGetAttribute(&pl, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)d1); printf("cuPointerGetAttribute(MEMPOOL_HANDLE) %.1f ns\n", ns_since(t, N));
  t = clk::now(); for (int i = 0; i < N; ++i) cuPointerGetAttribute(&pl, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)h1); printf("cuPointerGetAttribute(MEMPOOL_HANDLE) pinned %.1f ns\n", ns_since(t, N));
  unsigned long long id;
  t = clk::now(); for (int i = 0; i < N; ++i) cuStreamGetId((CUstream)s, &id); printf("cuStreamGetId %.1f ns\n", ns_since(t, N));
  CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  t = clk::now(); for (int i = 0; i < N; ++i) cuEventRecord(ev, (CUstream)s); printf("cuEventRecord %.1f ns\n", ns_since(t, N));
  CK(cudaStreamSynchronize(s));
  t = clk::now(); for (int i = 0; i < N; ++i) cuEventQuery(ev); printf("cuEventQuery (complete) %.1f ns\n", ns_since(t, N));
  CUdevice dev0; cuDeviceGet(&dev0, 0); unsigned flags; int active;
  t = clk::now(); for (int i = 0; i < N; ++i) cuDevicePrimaryCtxGetState(dev0, &flags, &active); printf("cuDevicePrimaryCtxGetState %.1f ns (active %d)\n", ns_since(t, N), active);
  t = clk::now(); for (int i = 0; i < 2000; ++i) cudaDeviceSynchronize(); printf("cudaDeviceSynchronize (idle) %.1f ns\n", ns_since(t, 2000));
  t = clk::now(); for (int i = 0; i < N; ++i) { void* q; cudaMallocFromPoolAsync(&q, 4096, devpool, s); cudaFreeAsync(q, s); } printf("device pool pair 4 KiB %.1f ns\n", ns_since(t, N));
  CK(cudaStreamSynchronize(s));
  // A device-wide synchronization while another thread captures (thread-local mode), from a
  // thread in relaxed mode: does it refuse, and is the other capture still valid?
  auto capture_beside = [&](const char* what, auto&& action) {
    cudaStream_t c; CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    std::atomic<int> phase{0};
    cudaError_t end = cudaSuccess; cudaGraph_t gr = nullptr;
    std::thread capturer([&] {
      cudaStreamBeginCapture(c, cudaStreamCaptureModeThreadLocal);
      cudaMemsetAsync(d1, 1, 4096, c);
      phase = 1;
      while (phase.load() != 2) std::this_thread::yield();
      cudaMemsetAsync(d1, 2, 4096, c);
      end = cudaStreamEndCapture(c, &gr);
    });
    while (phase.load() != 1) std::this_thread::yield();
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t r = action();
    cudaThreadExchangeStreamCaptureMode(&mode);
    phase = 2;
    capturer.join();
    printf("%s while another thread captures: %s; that capture ended %s\n", what, cudaGetErrorName(r), cudaGetErrorName(end));
    cudaGetLastError();
    if (gr) cudaGraphDestroy(gr);
    cudaStreamDestroy(c);
  };
  capture_beside("cudaDeviceSynchronize (relaxed)", [] { return cudaDeviceSynchronize(); });
  cudaStream_t rel; CK(cudaStreamCreateWithFlags(&rel, cudaStreamNonBlocking));
  cudaEvent_t mark; CK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
  capture_beside("event record + release-stream wait + free + stream sync (relaxed)", [&] {
    void* q = nullptr;
    cudaError_t r = cudaMallocFromPoolAsync(&q, 4096, devpool, s);
    if (r == cudaSuccess) r = cudaEventRecord(mark, s);
    if (r == cudaSuccess) r = cudaStreamWaitEvent(rel, mark, 0);
    if (r == cudaSuccess) r = cudaFreeAsync(q, rel);
    if (r == cudaSuccess) r = cudaStreamSynchronize(rel);
    return r;
  });
  // An event recorded on a stream that is then destroyed with work queued: does a wait on it
  // still wait for that work?
  {
    cudaStream_t dying; CK(cudaStreamCreateWithFlags(&dying, cudaStreamNonBlocking));
    auto t0 = clk::now();
    spin<<<1, 1, 0, dying>>>(1980LL * 1000 * 300);  // about 0.3 s at full clock
    CK(cudaEventRecord(mark, dying));
    CK(cudaStreamDestroy(dying));
    CK(cudaStreamWaitEvent(rel, mark, 0));
    CK(cudaStreamSynchronize(rel));
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    printf("wait on a destroyed stream's event: returned after %.0f ms (%s)\n", ms, ms > 100 ? "waited for its work" : "did NOT wait");
  }
  t = clk::now(); for (int i = 0; i < N; ++i) cudaEventRecord(mark, s); printf("cudaEventRecord (DisableTiming) %.1f ns\n", ns_since(t, N));
  CK(cudaStreamSynchronize(s));
  // A cheaper marker? A stream memory operation writing a sequence number to mapped host memory
  // (the release would wait with cuStreamWaitValue64), against the event record above.
  {
    unsigned long long* word = nullptr;
    CK(cudaHostAlloc((void**)&word, 64, cudaHostAllocMapped));
    CUdeviceptr dword = 0;
    CK(cudaHostGetDevicePointer((void**)&dword, word, 0));
    int memops = 0;
    cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev0);
    CUresult wr = cuStreamWriteValue64((CUstream)s, dword, 1, 0);
    printf("stream memory operations: attribute %d, first cuStreamWriteValue64 %d\n", memops, (int)wr);
    if (wr == CUDA_SUCCESS) {
      t = clk::now(); for (int i = 0; i < N; ++i) cuStreamWriteValue64((CUstream)s, dword, (unsigned long long)i, 0); printf("cuStreamWriteValue64 to mapped host memory %.1f ns\n", ns_since(t, N));
      CK(cudaStreamSynchronize(s));
      printf("the word after the writes: %llu (expected %d)\n", *word, N - 1);
      t = clk::now(); for (int i = 0; i < 2000; ++i) cuStreamWaitValue64((CUstream)rel, dword, (unsigned long long)(N - 1), CU_STREAM_WAIT_VALUE_GEQ); printf("cuStreamWaitValue64 (already true) %.1f ns\n", ns_since(t, 2000));
      CK(cudaStreamSynchronize(rel));
    }
    cudaGetLastError();
    cudaFreeHost(word);
  }
  printf("probe done\n");
  return 0;
}
