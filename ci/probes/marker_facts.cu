// What a front-cache put could mark its stream's place with (ci/gpu.sh probe): a put records
// the stream's event today (cuEventRecord, serialized by the driver across threads). A stream
// memory operation (cuStreamWriteValue64 of a put's number into host-mapped memory) would mark
// the same place: the value lands when the stream gets there, a host thread can read it without
// a driver call, and another stream can wait for it (cuStreamWaitValue64, GEQ).
//   marker_facts   prints the device's stream-memory-operation attributes; the cost of each
//                  marker, one thread and 8 threads on 8 streams; whether a write behind a
//                  running kernel waits for it, and lands after its stream is destroyed;
//                  whether a wait on another stream holds that stream back; what a capture
//                  makes of a write
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

using clk = std::chrono::steady_clock;

static double since_ns(clk::time_point t0)
{
  return std::chrono::duration<double, std::nano>(clk::now() - t0).count();
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

__global__ void spin(long long cycles)
{
  long long const t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

// ns per call of `body(stream, i, 0)` over `calls` calls, on one thread.
static double per_call(CUstream s, long calls,
                       std::function<CUresult(CUstream, long, int)> const& body)
{
  auto const t0 = clk::now();
  for (long i = 0; i < calls; ++i) { static_cast<void>(body(s, i, 0)); }
  double const ns = since_ns(t0) / calls;
  check(cuStreamSynchronize(s), "cuStreamSynchronize");
  return ns;
}

// Aggregate calls/s of `n` threads, each on its own stream and its own word.
static double threads_rate(std::vector<CUstream> const& streams, CUcontext ctx, long calls,
                           std::function<CUresult(CUstream, long, int)> const& body)
{
  int const n = static_cast<int>(streams.size());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<clk::time_point> start(n), end(n);
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      cuCtxSetCurrent(ctx);
      ready.fetch_add(1);
      while (!go.load()) { std::this_thread::yield(); }
      start[t] = clk::now();
      for (long i = 0; i < calls; ++i) { static_cast<void>(body(streams[t], i, t)); }
      end[t] = clk::now();
    });
  }
  while (ready.load() < n) { std::this_thread::yield(); }
  go.store(true);
  for (auto& th : pool) { th.join(); }
  for (auto s : streams) { check(cuStreamSynchronize(s), "cuStreamSynchronize"); }
  double const s = std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                                 *std::min_element(start.begin(), start.end()))
                     .count();
  return static_cast<double>(calls) * n / s;
}

static double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  check(cuInit(0), "cuInit");
  cudaFree(0);
  CUcontext ctx{};
  check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  CUdevice dev{};
  check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
  int mem_ops = -1, ops64 = -1, nor = -1, flush = -1;
  cuDeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
  cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
  cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
  cuDeviceGetAttribute(&flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, dev);
  int version = 0;
  cuDriverGetVersion(&version);
  std::printf("driver %d; stream mem ops v1 %d, 64-bit %d, wait NOR %d, flush remote writes %d\n",
              version, mem_ops, ops64, nor, flush);

  // Host-mapped words, one cache line apart (a thread's word is its own line).
  constexpr int words = 64;
  unsigned long long* host = nullptr;
  check(cuMemHostAlloc(reinterpret_cast<void**>(&host), words * 64,
                       CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
        "cuMemHostAlloc");
  std::fill(host, host + words * 8, 0ULL);
  CUdeviceptr host_d{};
  check(cuMemHostGetDevicePointer(&host_d, host, 0), "cuMemHostGetDevicePointer");
  CUdeviceptr dmem{};
  check(cuMemAlloc(&dmem, words * 64), "cuMemAlloc");
  auto word = [&](int t) { return host_d + static_cast<CUdeviceptr>(t) * 64; };

  CUstream s{};
  check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  std::vector<CUevent> events(words);
  for (auto& e : events) { check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate"); }

  // Each way's call, on thread t's event or word; its status is checked once below and
  // ignored while timed.
  struct way {
    char const* name;
    std::function<CUresult(CUstream, long, int)> body;
  };
  auto write64 = [](CUdeviceptr at, unsigned flags) {
    return [at, flags](CUstream st, long i, int t) {
      return cuStreamWriteValue64(st, at + static_cast<CUdeviceptr>(t) * 64,
                                  static_cast<cuuint64_t>(i + 1), flags);
    };
  };
  std::vector<way> ways = {
    {"cuEventRecord", [&](CUstream st, long, int t) { return cuEventRecord(events[t], st); }},
    {"cuStreamWriteValue64 host", write64(host_d, CU_STREAM_WRITE_VALUE_DEFAULT)},
    {"cuStreamWriteValue64 host, no barrier",
     write64(host_d, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)},
    {"cuStreamWriteValue32 host",
     [&](CUstream st, long i, int t) {
       return cuStreamWriteValue32(st, word(t), static_cast<cuuint32_t>(i + 1),
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
     }},
    {"cuStreamWriteValue64 device", write64(dmem, CU_STREAM_WRITE_VALUE_DEFAULT)},
    {"cuStreamQuery", [&](CUstream st, long, int) { return cuStreamQuery(st); }},
  };
  // Does each call succeed at all? (A query of an idle stream answers CUDA_SUCCESS too.)
  for (auto& w : ways) {
    char const* name = nullptr;
    cuGetErrorName(w.body(s, 0, 0), &name);
    std::printf("first call, %s: %s\n", w.name, name);
  }
  check(cuStreamSynchronize(s), "cuStreamSynchronize");

  long const calls = 20000;
  int const rounds = 9;
  std::vector<std::vector<double>> one(ways.size());
  for (auto& w : ways) { per_call(s, 2000, w.body); }
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t k = 0; k < ways.size(); ++k) {
      std::size_t const i = (k + r) % ways.size();
      one[i].push_back(per_call(s, calls, ways[i].body));
    }
  }
  std::vector<CUstream> streams(8);
  for (auto& st : streams) { check(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); }
  std::vector<CUstream> one_stream(streams.begin(), streams.begin() + 1);
  std::printf("%-40s %10s %12s %12s %8s\n", "call", "ns (1 thr)", "1 thr /s", "8 thr /s", "scaling");
  for (std::size_t i = 0; i < ways.size(); ++i) {
    std::vector<double> r1, r8;
    for (int r = 0; r < 5; ++r) {
      r1.push_back(threads_rate(one_stream, ctx, calls, ways[i].body));
      r8.push_back(threads_rate(streams, ctx, calls, ways[i].body));
    }
    std::printf("%-40s %10.1f %12.0f %12.0f %8.2f\n", ways[i].name, median(one[i]), median(r1),
                median(r8), median(r8) / median(r1));
  }

  // Order: a write behind a kernel that runs ~200 ms lands only after it, also when its stream is
  // destroyed right after the call.
  long long const cycles = 400LL * 1000 * 1000;  // ~200 ms at ~2 GHz
  for (int destroy = 0; destroy < 2; ++destroy) {
    CUstream k{};
    check(cuStreamCreate(&k, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    volatile unsigned long long* w = host + 16 * 8;  // word 16
    *w                             = 0;
    spin<<<1, 1, 0, reinterpret_cast<cudaStream_t>(k)>>>(cycles);
    check(cuStreamWriteValue64(k, word(16), 42, CU_STREAM_WRITE_VALUE_DEFAULT), "write behind spin");
    auto const t0 = clk::now();
    unsigned long long const at_once = *w;
    if (destroy) { check(cuStreamDestroy(k), "cuStreamDestroy"); }
    while (*w != 42 && since_ns(t0) < 5e9) {}
    std::printf("write behind a ~200 ms kernel%s: %llu at once, %llu after %.1f ms\n",
                destroy ? ", stream destroyed at once" : "", at_once, *w, since_ns(t0) / 1e6);
    if (!destroy) { check(cuStreamSynchronize(k), "sync"); check(cuStreamDestroy(k), "destroy"); }
  }

  // A wait on another stream holds it back until the value lands.
  {
    CUstream k{}, r{};
    check(cuStreamCreate(&k, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuStreamCreate(&r, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    host[17 * 8] = 0;
    spin<<<1, 1, 0, reinterpret_cast<cudaStream_t>(k)>>>(cycles);
    check(cuStreamWriteValue64(k, word(17), 5, CU_STREAM_WRITE_VALUE_DEFAULT), "write");
    check(cuStreamWaitValue64(r, word(17), 5, CU_STREAM_WAIT_VALUE_GEQ), "wait GEQ");
    check(cuStreamDestroy(k), "destroy k");
    CUresult const q = cuStreamQuery(r);
    auto const t0    = clk::now();
    check(cuStreamSynchronize(r), "sync r");
    char const* name = nullptr;
    cuGetErrorName(q, &name);
    std::printf("wait GEQ on another stream: query at once %s, synchronized after %.1f ms\n", name,
                since_ns(t0) / 1e6);
    check(cuStreamDestroy(r), "destroy r");
  }

  // A capture: what a write on the capturing stream does, and whether the capture survives.
  {
    CUstream c{};
    check(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
    CUresult const w = cuStreamWriteValue64(c, word(18), 9, CU_STREAM_WRITE_VALUE_DEFAULT);
    CUgraph g{};
    CUresult const e = cuStreamEndCapture(c, &g);
    size_t nodes     = 0;
    if (e == CUDA_SUCCESS && g != nullptr) { cuGraphGetNodes(g, nullptr, &nodes); }
    char const *wn = nullptr, *en = nullptr;
    cuGetErrorName(w, &wn);
    cuGetErrorName(e, &en);
    std::printf("write while capturing: %s; end capture %s, %zu node(s); value now %llu\n", wn, en,
                nodes, host[18 * 8]);
    if (g) { cuGraphDestroy(g); }
    cuStreamDestroy(c);
  }
  std::printf("probe done\n");
  return 0;
}
