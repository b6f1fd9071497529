// What growing a pool up front (allocate N bytes, free them, keep them: RMM's initial_pool_size
// on a driver pool) buys a first pass, and what it costs (ci/gpu.sh probe). A driver pool grows
// when a request does not fit what it holds; RMM's PoolMemoryResource over managed memory takes
// 80% of the free device memory in one cudaMallocManaged first (cudf.pandas's "managed_pool").
//   reserve_facts  prints, per pool kind (a new managed pool on device 0, a new device pool, a
//                  new host pinned pool), each on a fresh pool:
//                  - a reservation of R bytes (allocate R, free, synchronize): its time, the
//                    pool's reserved bytes after it, the device's free memory before and after
//                    (does managed reservation commit device memory?), and after a kernel first
//                    touched the reserved range;
//                  - a first pass of a workload (1200 allocations of 64 KiB to 16 MiB cycling,
//                    ~1 GiB live at the peak (managed, device; 256 MiB pinned), then all freed,
//                    on one stream, synchronized) on a fresh pool and on a pool reserved first
//                    (three rounds):
//                    ms, and the pool's reserved bytes after it (did it grow past the
//                    reservation?); and the warm second pass of each, for reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

using clk = std::chrono::steady_clock;

static void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

static double ms_since(clk::time_point t0)
{
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

__global__ void touch(unsigned char* p, std::size_t n, std::size_t stride)
{
  for (std::size_t i = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) * stride; i < n;
       i += std::size_t{gridDim.x} * blockDim.x * stride) {
    p[i] = 1;
  }
}

struct kind {
  char const* name;
  cudaMemAllocationType type;
  cudaMemLocationType where;
  std::size_t reserve;
  std::size_t live_cap;
};

static cudaMemPool_t make_pool(kind const& k)
{
  cudaMemPoolProps props{};
  props.allocType     = k.type;
  props.location.type = k.where;
  props.location.id   = 0;
  cudaMemPool_t pool{};
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  std::uint64_t keep = ~std::uint64_t{0};
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "threshold");
  if (k.where == cudaMemLocationTypeHost) {
    cudaMemAccessDesc d{};
    d.location = {cudaMemLocationTypeDevice, 0};
    d.flags    = cudaMemAccessFlagsProtReadWrite;
    check(cudaMemPoolSetAccess(pool, &d, 1), "cudaMemPoolSetAccess");
  }
  return pool;
}

static std::uint64_t reserved(cudaMemPool_t pool)
{
  std::uint64_t v = 0;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v), "reserved");
  return v;
}

static std::size_t free_device_bytes()
{
  std::size_t f = 0, t = 0;
  check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  return f;
}

// 1200 allocations cycling 64 KiB .. 16 MiB; a block is freed once the live bytes pass live_cap
// (oldest first), the rest at the end; one stream, synchronized: ms.
static double pass(cudaMemPool_t pool, cudaStream_t s, std::size_t live_cap)
{
  static std::size_t const sizes[] = {64 << 10, 1 << 20, 256 << 10, 16 << 20, 4 << 20, 512 << 10};
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t live_bytes = 0, head = 0;
  auto const t0          = clk::now();
  for (int i = 0; i < 1200; ++i) {
    std::size_t const n = sizes[i % 6];
    void* p             = nullptr;
    check(cudaMallocFromPoolAsync(&p, n, pool, s), "cudaMallocFromPoolAsync");
    live.emplace_back(p, n);
    live_bytes += n;
    while (live_bytes > live_cap) {
      check(cudaFreeAsync(live[head].first, s), "cudaFreeAsync");
      live_bytes -= live[head].second;
      ++head;
    }
  }
  for (; head < live.size(); ++head) { check(cudaFreeAsync(live[head].first, s), "free"); }
  check(cudaStreamSynchronize(s), "sync");
  return ms_since(t0);
}

int main()
{
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::printf("reserve_facts: driver %d\n", driver);
  cudaStream_t s{};
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");

  kind const kinds[] = {
    {"managed@device0", cudaMemAllocationTypeManaged, cudaMemLocationTypeDevice, std::size_t{8} << 30,
     std::size_t{1} << 30},
    {"device0", cudaMemAllocationTypePinned, cudaMemLocationTypeDevice, std::size_t{2} << 30,
     std::size_t{1} << 30},
    {"pinned@host", cudaMemAllocationTypePinned, cudaMemLocationTypeHost, std::size_t{512} << 20,
     std::size_t{256} << 20},
  };
  for (int round = 0; round < 3; ++round) {
  std::printf("round %d\n", round);
  for (auto const& k : kinds) {
    // The reservation itself, on a fresh pool.
    cudaMemPool_t pool       = make_pool(k);
    std::size_t const free0  = free_device_bytes();
    auto const t0            = clk::now();
    void* block              = nullptr;
    check(cudaMallocFromPoolAsync(&block, k.reserve, pool, s), "reserve alloc");
    check(cudaFreeAsync(block, s), "reserve free");
    check(cudaStreamSynchronize(s), "reserve sync");
    double const reserve_ms  = ms_since(t0);
    std::size_t const free1  = free_device_bytes();
    std::uint64_t const res1 = reserved(pool);
    std::printf("%s: reserve %zu MiB: %.2f ms, pool reserved %llu MiB, device free %zu -> %zu MiB\n",
                k.name, k.reserve >> 20, reserve_ms, (unsigned long long)(res1 >> 20), free0 >> 20,
                free1 >> 20);
    // A first pass on the reserved pool, then a warm one.
    double const first_reserved = pass(pool, s, k.live_cap);
    std::uint64_t const res2    = reserved(pool);
    double const warm_reserved  = pass(pool, s, k.live_cap);
    // What touching the whole reservation from a kernel does to the device's free memory.
    if (k.where == cudaMemLocationTypeDevice) {
      check(cudaMallocFromPoolAsync(&block, k.reserve, pool, s), "touch alloc");
      touch<<<1024, 256, 0, s>>>(static_cast<unsigned char*>(block), k.reserve, 4096);
      check(cudaGetLastError(), "touch launch");
      check(cudaStreamSynchronize(s), "touch sync");
      std::printf("%s: after a kernel touched every 4 KiB of the reservation: device free %zu MiB\n",
                  k.name, free_device_bytes() >> 20);
      check(cudaFreeAsync(block, s), "touch free");
      check(cudaStreamSynchronize(s), "touch free sync");
    }
    check(cudaMemPoolTrimTo(pool, 0), "trim");
    check(cudaMemPoolDestroy(pool), "destroy");
    // The same passes on a fresh pool that was not reserved.
    pool                     = make_pool(k);
    double const first_fresh = pass(pool, s, k.live_cap);
    std::uint64_t const res3 = reserved(pool);
    double const warm_fresh  = pass(pool, s, k.live_cap);
    check(cudaMemPoolTrimTo(pool, 0), "trim");
    check(cudaMemPoolDestroy(pool), "destroy");
    std::printf("%s: first pass %.2f ms fresh (pool grew to %llu MiB), %.2f ms reserved (pool "
                "%llu MiB after it); warm pass %.2f ms fresh, %.2f ms reserved\n",
                k.name, first_fresh, (unsigned long long)(res3 >> 20), first_reserved,
                (unsigned long long)(res2 >> 20), warm_fresh, warm_reserved);
  }
  }
  check(cudaStreamDestroy(s), "stream destroy");
  std::printf("reserve_facts: done\n");
  return 0;
}
