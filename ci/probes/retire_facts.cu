// What retiring a created pool does, pool kind by kind, after stream-ordered use that the
// driver may still be running when the pool goes (ci/gpu.sh probe, PROBES=retire).
//
//   retire_facts KIND PLACE ROUNDS [WORD...]
//     KIND   device | pinned | managed
//     PLACE  none | device | host: a prefetch of each block before its free (managed only)
//   WORDs, in any order:
//     sync           synchronize the device before each destroy
//     pool-first     destroy the round's created stream after the pool, not before it
//                    (asyncmr's order when a resource is dropped before the stream it used)
//     max-threshold  release threshold at its maximum, as asyncmr sets an owned pool's
//     fresh-only     use only the round's created stream (not the legacy, per-thread and
//                    long-lived ones)
//     hold           a host function holds the created stream 20 ms before the round's work,
//                    so that its prefetches and frees are still queued when the pool is checked
//                    (the first round prints the counters it read)
//     thread         destroy pools on a second thread, while the main thread goes on to the
//                    next round (as asyncmr's sweeper does): it looks every millisecond, trims
//                    each pool to 0 and destroys it once it holds nothing
//     no-trim        (with thread) the pool's release threshold set to 0 when it is handed
//                    over, and the second thread never trims: it waits for the driver to give
//                    the memory back itself
//     delay=N        (with thread) destroy a pool N ms after it was first seen holding nothing
//     settle         one round on the long-lived stream only: the counters after a trim to 0,
//                    200 ms after the work was queued (long done), then after the stream is
//                    synchronized: whether the driver sees a free ran before a synchronization
//
// Each round creates a pool, allocates and frees 4 KiB, 64 KiB and 1 MiB + 512 on the legacy,
// per-thread and a created stream (destroyed at once), trims the pool to 0 and reads its
// counters, then destroys it when it holds nothing (what asyncmr checks before a destroy), else
// keeps it for the next round's check. "sync" synchronizes the device before each destroy.
// One line a round where something is kept; the last line says how the run ended. Run it in a
// shell that reports the signal: a crash inside cuMemPoolDestroy ends it.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

static unsigned long long attr(cudaMemPool_t p, cudaMemPoolAttr a)
{
  unsigned long long v = ~0ULL;
  cudaError_t e = cudaMemPoolGetAttribute(p, a, &v);
  if (e != cudaSuccess) { printf("  attribute %d: %s\n", (int)a, cudaGetErrorName(e)); }
  return v;
}

// A pool of KIND: device memory, pinned host memory, or managed memory located on device 0.
static cudaMemPoolProps pool_props(const char* kind)
{
  cudaMemPoolProps props{};
  props.allocType = strcmp(kind, "managed") == 0 ? cudaMemAllocationTypeManaged
                                                 : cudaMemAllocationTypePinned;
  props.location  = strcmp(kind, "pinned") == 0 ? cudaMemLocation{cudaMemLocationTypeHost, 0}
                                                : cudaMemLocation{cudaMemLocationTypeDevice, 0};
  return props;
}

static void CUDART_CB hold_stream(void*) { usleep(20 * 1000); }

// asyncmr's check: used 0, and reserved 0 after a trim to 0.
static bool holds_nothing(cudaMemPool_t k, bool print)
{
  cudaMemPoolTrimTo(k, 0);
  unsigned long long used     = attr(k, cudaMemPoolAttrUsedMemCurrent);
  unsigned long long reserved = attr(k, cudaMemPoolAttrReservedMemCurrent);
  if (print) { printf("  counters after trim_to(0): used %llu, reserved %llu\n", used, reserved); }
  return used == 0 && reserved == 0;
}

// The destroying thread: destroys the pools handed to it once they hold nothing.
struct destroyer {
  std::mutex m;
  std::condition_variable cv;
  std::deque<cudaMemPool_t> queue;
  bool done = false;
  bool trim = true;  // "no-trim": wait for the driver to release the memory itself
  int delay_ms = 0;  // "delay=N": destroy N ms after the pool was first seen holding nothing
  int destroyed = 0;
  bool idle(cudaMemPool_t k)
  {
    if (trim) { return holds_nothing(k, false); }
    return attr(k, cudaMemPoolAttrUsedMemCurrent) == 0 &&
           attr(k, cudaMemPoolAttrReservedMemCurrent) == 0;
  }
  void run()
  {
    using clock = std::chrono::steady_clock;
    std::vector<std::pair<cudaMemPool_t, clock::time_point>> waiting;
    std::unique_lock<std::mutex> lock{m};
    while (!done || !queue.empty() || !waiting.empty()) {
      while (!queue.empty()) { waiting.emplace_back(queue.front(), clock::time_point{}); queue.pop_front(); }
      lock.unlock();
      std::vector<std::pair<cudaMemPool_t, clock::time_point>> still;
      for (auto [k, since] : waiting) {
        if (!idle(k)) {
          still.emplace_back(k, clock::time_point{});
          continue;
        }
        auto const now = clock::now();
        if (since == clock::time_point{}) { since = now; }
        if (now - since < std::chrono::milliseconds{delay_ms}) {
          still.emplace_back(k, since);
          continue;
        }
        cudaError_t e = cudaMemPoolDestroy(k);
        if (e != cudaSuccess) { printf("thread: destroy %s\n", cudaGetErrorName(e)); }
        ++destroyed;
      }
      waiting.swap(still);
      usleep(1000);
      lock.lock();
      if (queue.empty() && !done && waiting.empty()) { cv.wait(lock); }
    }
  }
};

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 4) { fprintf(stderr, "usage: retire_facts KIND PLACE ROUNDS [WORD...]\n"); return 2; }
  const char* kind  = argv[1];
  const char* place = argv[2];
  int rounds        = atoi(argv[3]);
  bool sync = false, pool_first = false, max_threshold = false, fresh_only = false, hold = false,
       threaded = false, settle = false, no_trim = false;
  int delay_ms = 0;
  std::string words;
  for (int i = 4; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "sync") { sync = true; }
    else if (w == "pool-first") { pool_first = true; }
    else if (w == "max-threshold") { max_threshold = true; }
    else if (w == "fresh-only") { fresh_only = true; }
    else if (w == "hold") { hold = true; }
    else if (w == "thread") { threaded = true; }
    else if (w == "no-trim") { no_trim = true; }
    else if (w.rfind("delay=", 0) == 0) { delay_ms = atoi(w.c_str() + 6); }
    else if (w == "settle") { settle = true; }
    else if (w == "nosync" || w == "stream-first") { continue; }
    else { fprintf(stderr, "unknown word %s\n", argv[i]); return 2; }
    words += " " + w;
  }
  cudaFree(0);
  // Other memory in the process, as RMM and CuPy hold it.
  void* other = nullptr;
  cudaMalloc(&other, 1 << 20);
  cudaStream_t long_lived;
  cudaStreamCreateWithFlags(&long_lived, cudaStreamNonBlocking);
  destroyer d;
  d.trim     = !no_trim;
  d.delay_ms = delay_ms;
  std::thread worker;
  if (threaded) { worker = std::thread{[&] { d.run(); }}; }
  size_t sizes[] = {4096, 64 << 10, (1 << 20) + 512};
  if (settle) {
    cudaMemPoolProps const props = pool_props(kind);
    cudaMemPool_t pool;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) { printf("create refused\n"); return 1; }
    for (size_t n : sizes) {
      void* p = nullptr;
      cudaMallocFromPoolAsync(&p, n, pool, long_lived);
      cudaFreeAsync(p, long_lived);
    }
    usleep(200 * 1000);
    printf("settle %s: 200 ms after the frees were queued:", kind);
    holds_nothing(pool, true);
    cudaStreamSynchronize(long_lived);
    printf("settle %s: after cudaStreamSynchronize:", kind);
    holds_nothing(pool, true);
    return 0;
  }
  std::vector<cudaMemPool_t> kept;
  int destroyed = 0, refused_prefetches = 0;
  cudaError_t e = cudaSuccess;
  for (int r = 0; r < rounds; ++r) {
    cudaMemPoolProps const props = pool_props(kind);
    cudaMemPool_t pool;
    e = cudaMemPoolCreate(&pool, &props);
    if (e != cudaSuccess) { printf("round %d: create %s\n", r, cudaGetErrorName(e)); return 1; }
    if (max_threshold) {
      unsigned long long most = ~0ULL;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &most);
    }
    if (strcmp(kind, "pinned") == 0) {
      cudaMemAccessDesc desc{{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
      cudaMemPoolSetAccess(pool, &desc, 1);
    }
    cudaStream_t fresh;
    cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking);
    if (hold) { cudaLaunchHostFunc(fresh, hold_stream, nullptr); }
    std::vector<cudaStream_t> streams{fresh};
    if (!fresh_only) { streams = {cudaStreamLegacy, cudaStreamPerThread, long_lived, fresh}; }
    for (cudaStream_t s : streams) {
      for (size_t n : sizes) {
        void* p = nullptr;
        e = cudaMallocFromPoolAsync(&p, n, pool, s);
        if (e != cudaSuccess) { printf("round %d: alloc %s\n", r, cudaGetErrorName(e)); return 1; }
        if (strcmp(place, "none") != 0) {
          cudaMemLocation to = strcmp(place, "host") == 0 ? cudaMemLocation{cudaMemLocationTypeHost, 0}
                                                          : cudaMemLocation{cudaMemLocationTypeDevice, 0};
          e = cudaMemPrefetchAsync(p, n, to, 0, s);
          if (e != cudaSuccess) {
            if (refused_prefetches++ < 3) { printf("round %d: prefetch %s\n", r, cudaGetErrorName(e)); }
            cudaGetLastError();
          }
        }
        cudaFreeAsync(p, s);
      }
    }
    if (!pool_first) { cudaStreamDestroy(fresh); }
    if (sync) { cudaDeviceSynchronize(); }
    if (threaded) {
      if (r == 0 && hold) { holds_nothing(pool, true); }
      if (no_trim) {  // the driver gives back what its frees release at its synchronizations
        unsigned long long none = 0;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &none);
      }
      std::lock_guard<std::mutex> lock{d.m};
      d.queue.push_back(pool);
      d.cv.notify_one();
    } else {
      kept.push_back(pool);
      std::vector<cudaMemPool_t> still;
      for (cudaMemPool_t k : kept) {
        if (holds_nothing(k, r == 0 && hold)) {
          e = cudaMemPoolDestroy(k);
          if (e != cudaSuccess) { printf("round %d: destroy %s\n", r, cudaGetErrorName(e)); }
          ++destroyed;
        } else {
          if (still.empty() && r < 3) { printf("round %d: kept %p\n", r, (void*)k); }
          still.push_back(k);
        }
      }
      kept.swap(still);
    }
    if (pool_first) { cudaStreamDestroy(fresh); }
  }
  if (threaded) {
    { std::lock_guard<std::mutex> lock{d.m}; d.done = true; d.cv.notify_one(); }
    worker.join();
    destroyed = d.destroyed;
  }
  e = cudaDeviceSynchronize();
  printf("retire %s %s%s: %d rounds, %d destroyed, %zu kept, %d prefetches refused, "
         "synchronize %s\n", kind, place, words.c_str(), rounds, destroyed, kept.size(),
         refused_prefetches, cudaGetErrorName(e));
  return 0;
}
