// What a discard of managed pool memory does to the bytes around it, and what discarding at
// allocation would buy (ci/gpu.sh probe). A pool hands out blocks 256 bytes apart, so a block's
// first and last page are usually shared with its neighbours: if the driver dropped whole pages
// that a range only touches, asyncmr.discard of one array would drop its neighbours' contents.
//   discard_facts  prints
//                  - per (range, residency, operation): the driver's answer, and the bytes that
//                    changed outside the range (must be 0) and inside it, checked on the device
//                    and on the host. Ranges from 4 KiB 256 B past a page boundary to one whole
//                    2 MiB page, on pages last written by the host or by the device;
//                  - the same for two neighbouring 4 KiB blocks of a new managed pool;
//                  - per way of placing 256 MiB (and 64 KiB) of host-touched or device-resident
//                    pool memory before a kernel reads it: ms from the placement call to the
//                    kernel's end (median of 5 interleaved rounds), so what discarding the old
//                    contents at allocation saves over prefetching them.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using clk = std::chrono::steady_clock;

static void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

__host__ __device__ inline std::uint8_t pattern(std::size_t i, unsigned seed)
{
  return static_cast<std::uint8_t>((i * 31u + seed) & 0xffu);
}

__global__ void fill(std::uint8_t* p, std::size_t n, unsigned seed)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = pattern(i, seed);
  }
}

// Counts bytes that differ from the pattern, inside [lo, hi) and outside it.
__global__ void count_changed(std::uint8_t const* p, std::size_t n, std::size_t lo, std::size_t hi,
                              unsigned seed, unsigned long long* counts)
{
  unsigned long long in = 0, out = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (p[i] != pattern(i, seed)) { (i >= lo && i < hi) ? ++in : ++out; }
  }
  if (in) atomicAdd(&counts[0], in);
  if (out) atomicAdd(&counts[1], out);
}

__global__ void sum(std::uint8_t const* p, std::size_t n, unsigned long long* out)
{
  unsigned long long s = 0;
  for (std::size_t i = (blockIdx.x * blockDim.x + threadIdx.x) * 64; i < n;
       i += std::size_t{gridDim.x} * blockDim.x * 64) {
    s += p[i];
  }
  if (s) atomicAdd(out, s);
}

static void host_fill(std::uint8_t* p, std::size_t n, unsigned seed)
{
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}

static unsigned long long host_changed_outside(std::uint8_t const* p, std::size_t n,
                                               std::size_t lo, std::size_t hi, unsigned seed)
{
  unsigned long long out = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if ((i < lo || i >= hi) && p[i] != pattern(i, seed)) ++out;
  }
  return out;
}

static cudaMemLocation dev0() { return cudaMemLocation{cudaMemLocationTypeDevice, 0}; }
static cudaMemLocation host() { return cudaMemLocation{cudaMemLocationTypeHost, 0}; }

enum class op { discard, discard_prefetch_device, discard_prefetch_host };
static char const* name(op o)
{
  return o == op::discard                   ? "discard"
         : o == op::discard_prefetch_device ? "discard+prefetch(dev0)"
                                            : "discard+prefetch(host)";
}

static cudaError_t apply(op o, void* p, std::size_t n, cudaStream_t s)
{
  void* ptrs[1]         = {p};
  std::size_t sizes[1]  = {n};
  std::size_t first     = 0;
  if (o == op::discard) return cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s);
  cudaMemLocation where = o == op::discard_prefetch_device ? dev0() : host();
  return cudaMemDiscardAndPrefetchBatchAsync(ptrs, sizes, 1, &where, &first, 1, 0, s);
}

static cudaMemPool_t managed_pool()
{
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypeManaged;
  props.location  = dev0();
  cudaMemPool_t pool;
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate(managed @device 0)");
  std::uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "threshold");
  return pool;
}

// One neighbourhood check: the window is filled (by the host or a kernel), the operation is
// applied to [lo, hi), then the window is compared with the pattern.
static void neighbours(char const* range_name, std::uint8_t* window, std::size_t n,
                       std::size_t lo, std::size_t hi, bool host_wrote, op o, cudaStream_t s,
                       unsigned long long* counts, unsigned seed)
{
  if (host_wrote) {
    host_fill(window, n, seed);
  } else {
    fill<<<256, 256, 0, s>>>(window, n, seed);
    check(cudaStreamSynchronize(s), "fill");
  }
  cudaError_t const e = apply(o, window + lo, hi - lo, s);
  cudaError_t const sync = cudaStreamSynchronize(s);
  if (e != cudaSuccess) cudaGetLastError();
  // The host looks first (its reads move pages to the host), then a kernel.
  unsigned long long const host_out = host_changed_outside(window, n, lo, hi, seed);
  check(cudaMemsetAsync(counts, 0, 2 * sizeof(unsigned long long), s), "memset counts");
  count_changed<<<256, 256, 0, s>>>(window, n, lo, hi, seed, counts);
  unsigned long long c[2] = {0, 0};
  check(cudaMemcpyAsync(c, counts, sizeof c, cudaMemcpyDeviceToHost, s), "copy counts");
  check(cudaStreamSynchronize(s), "count");
  std::printf("neighbours %-40s last written by %-6s %-24s: %-22s sync %-12s changed outside "
              "(host) %llu (device) %llu, inside %llu of %zu\n",
              range_name, host_wrote ? "host" : "device", name(o), cudaGetErrorName(e),
              cudaGetErrorName(sync), host_out, c[1], c[0], hi - lo);
}

static double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  check(cudaFree(0), "context");
  int concurrent = 0;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::printf("driver %d, concurrent managed access %d\n", driver, concurrent);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  unsigned long long* counts;
  check(cudaMalloc(&counts, 2 * sizeof(unsigned long long)), "counts");
  cudaMemPool_t pool = managed_pool();

  // 1. Ranges inside one 16 MiB block, relative to a 2 MiB-aligned point in it.
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  void* raw = nullptr;
  check(cudaMallocFromPoolAsync(&raw, 16 * MiB, pool, s), "16 MiB");
  check(cudaStreamSynchronize(s), "alloc");
  auto const a = reinterpret_cast<std::uintptr_t>(raw);
  auto* const window = reinterpret_cast<std::uint8_t*>((a + 2 * MiB - 1) & ~(2 * MiB - 1));
  std::size_t const n = 8 * MiB;
  std::printf("block %p, window %p (2 MiB aligned), %zu bytes\n", raw, (void*)window, n);
  struct range { char const* name; std::size_t lo, len; } ranges[] = {
    {"4 KiB, 256 B past a 4 KiB boundary", 4 * KiB + 256, 4 * KiB},
    {"4 KiB, 4 KiB-aligned, inside a 64 KiB", 64 * KiB + 4 * KiB, 4 * KiB},
    {"64 KiB, 64 KiB-aligned, inside a 2 MiB", MiB, 64 * KiB},
    {"one whole 2 MiB page", 2 * MiB, 2 * MiB},
    {"2 MiB less 256 B at each end", 4 * MiB + 256, 2 * MiB - 512},
  };
  unsigned seed = 1;
  for (auto const& r : ranges) {
    for (bool host_wrote : {true, false}) {
      for (op o : {op::discard, op::discard_prefetch_device, op::discard_prefetch_host}) {
        neighbours(r.name, window, n, r.lo, r.lo + r.len, host_wrote, o, s, counts, seed++);
      }
    }
  }
  check(cudaFreeAsync(raw, s), "free");

  // 2. Two neighbouring 4 KiB blocks of a new pool: discard the first, check the second.
  {
    cudaMemPool_t small = managed_pool();
    void *x = nullptr, *y = nullptr;
    check(cudaMallocFromPoolAsync(&x, 4 * KiB, small, s), "x");
    check(cudaMallocFromPoolAsync(&y, 4 * KiB, small, s), "y");
    check(cudaStreamSynchronize(s), "alloc x y");
    auto* lo_block = static_cast<std::uint8_t*>(std::min(x, y));
    auto* hi_block = static_cast<std::uint8_t*>(std::max(x, y));
    std::size_t const gap = hi_block - lo_block;
    std::printf("two 4 KiB pool blocks %zu bytes apart\n", gap);
    if (gap < 64 * KiB) {
      for (bool host_wrote : {true, false}) {
        for (op o : {op::discard, op::discard_prefetch_device, op::discard_prefetch_host}) {
          // The window spans both blocks; the operation covers the first one only.
          neighbours("the first of two 4 KiB pool blocks", lo_block, gap + 4 * KiB, 0, 4 * KiB,
                     host_wrote, o, s, counts, seed++);
        }
      }
    }
    cudaFreeAsync(x, s);
    cudaFreeAsync(y, s);
    check(cudaStreamSynchronize(s), "free x y");
    cudaMemPoolDestroy(small);
  }

  // 3. What each way of placing costs before a kernel reads the memory.
  unsigned long long* total;
  check(cudaMalloc(&total, sizeof *total), "total");
  for (std::size_t bytes : {256 * MiB, 64 * KiB}) {
    void* p = nullptr;
    check(cudaMallocFromPoolAsync(&p, bytes, pool, s), "timed block");
    check(cudaStreamSynchronize(s), "timed alloc");
    auto* const b = static_cast<std::uint8_t*>(p);
    auto const lo = (reinterpret_cast<std::uintptr_t>(b) + 2 * MiB - 1) & ~(2 * MiB - 1);
    auto const hi = (reinterpret_cast<std::uintptr_t>(b) + bytes) & ~(2 * MiB - 1);
    std::size_t const head = lo - reinterpret_cast<std::uintptr_t>(b);
    bool const has_inner = hi > lo;
    enum way { faults, prefetch, whole, inner, ways };
    char const* way_name[ways] = {"no placement (faults)", "prefetch(dev0)",
                                  "discard+prefetch(dev0), whole block",
                                  "discard+prefetch(dev0) of the 2 MiB pages inside, prefetch "
                                  "of the ends"};
    for (bool host_touched : {true, false}) {
      std::vector<double> ms[ways];
      for (int round = 0; round < 5; ++round) {
        for (int k = 0; k < ways; ++k) {
          int const w = (round + k) % ways;
          if (host_touched) {
            std::memset(b, 1, bytes);
          } else {
            fill<<<256, 256, 0, s>>>(b, bytes, 1);
            check(cudaStreamSynchronize(s), "device touch");
          }
          auto const t0 = clk::now();
          cudaError_t e = cudaSuccess;
          if (w == prefetch) {
            e = cudaMemPrefetchAsync(b, bytes, dev0(), 0, s);
          } else if (w == whole) {
            e = apply(op::discard_prefetch_device, b, bytes, s);
          } else if (w == inner) {
            if (has_inner) {
              e = apply(op::discard_prefetch_device, reinterpret_cast<void*>(lo), hi - lo, s);
              if (e == cudaSuccess && head > 0) e = cudaMemPrefetchAsync(b, head, dev0(), 0, s);
              if (e == cudaSuccess && reinterpret_cast<std::uintptr_t>(b) + bytes > hi) {
                e = cudaMemPrefetchAsync(reinterpret_cast<void*>(hi),
                                         reinterpret_cast<std::uintptr_t>(b) + bytes - hi, dev0(),
                                         0, s);
              }
            } else {
              e = cudaMemPrefetchAsync(b, bytes, dev0(), 0, s);
            }
          }
          check(e, way_name[w]);
          sum<<<264, 256, 0, s>>>(b, bytes, total);
          check(cudaStreamSynchronize(s), "timed kernel");
          ms[w].push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
        }
      }
      for (int w = 0; w < ways; ++w) {
        std::printf("place %9zu bytes, %-15s %-70s: median %8.3f ms (5 rounds)\n", bytes,
                    host_touched ? "host-touched" : "device-resident", way_name[w], median(ms[w]));
      }
    }
    check(cudaFreeAsync(p, s), "timed free");
  }
  check(cudaStreamSynchronize(s), "end");
  cudaMemPoolDestroy(pool);
  std::printf("done\n");
  return 0;
}
