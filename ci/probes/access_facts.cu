// What cudaMemPoolSetAccess does with the requests a careless caller makes (ci/gpu.sh probe):
// a pool's own device given read-only or no access, the same device named twice (same and
// different modes), and whether a refused call changed anything.
//   access_facts  prints, for a new device pool on device 0, a new managed pool on device 0, a
//                 new host pinned pool and device 0's default device pool, one line per request:
//                 the driver's answer, device 0's access afterwards (cudaMemPoolGetAccess), and
//                 whether the context still works (an allocation from the pool, freed,
//                 synchronized).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

static void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

static char const* name(cudaMemAccessFlags f)
{
  switch (f) {
    case cudaMemAccessFlagsProtReadWrite: return "rw";
    case cudaMemAccessFlagsProtRead: return "r";
    default: return "none";
  }
}

static cudaMemAccessDesc desc(int device, cudaMemAccessFlags f)
{
  cudaMemAccessDesc d{};
  d.location = {cudaMemLocationTypeDevice, device};
  d.flags    = f;
  return d;
}

static cudaMemPool_t make_pool(cudaMemAllocationType type, cudaMemLocationType where)
{
  cudaMemPoolProps props{};
  props.allocType     = type;
  props.location.type = where;
  props.location.id   = 0;
  cudaMemPool_t pool{};
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  return pool;
}

static void ask(char const* pool_name, cudaMemPool_t pool, char const* what,
                std::vector<cudaMemAccessDesc> const& descs, cudaStream_t s)
{
  cudaError_t const e = cudaMemPoolSetAccess(pool, descs.data(), descs.size());
  cudaError_t const sticky = cudaGetLastError();  // clears a non-sticky error
  cudaMemLocation loc{cudaMemLocationTypeDevice, 0};
  cudaMemAccessFlags f = cudaMemAccessFlagsProtNone;
  cudaError_t const g  = cudaMemPoolGetAccess(&f, pool, &loc);
  void* p              = nullptr;
  cudaError_t a        = cudaMallocFromPoolAsync(&p, 4096, pool, s);
  if (a == cudaSuccess) { a = cudaFreeAsync(p, s); }
  if (a == cudaSuccess) { a = cudaStreamSynchronize(s); }
  std::printf("%-16s %-28s -> %-28s (last error %s); device 0 access %s (%s); alloc+free %s\n",
              pool_name, what, cudaGetErrorName(e), cudaGetErrorName(sticky), name(f),
              cudaGetErrorName(g), cudaGetErrorName(a));
}

int main()
{
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::printf("access_facts: driver %d\n", driver);
  cudaStream_t s{};
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaMemPool_t default_pool{};
  check(cudaDeviceGetDefaultMemPool(&default_pool, 0), "default pool");
  struct named {
    char const* name;
    cudaMemPool_t pool;
  } const pools[] = {
    {"device0 new", make_pool(cudaMemAllocationTypePinned, cudaMemLocationTypeDevice)},
    {"managed@0 new", make_pool(cudaMemAllocationTypeManaged, cudaMemLocationTypeDevice)},
    {"pinned@host new", make_pool(cudaMemAllocationTypePinned, cudaMemLocationTypeHost)},
    {"device0 default", default_pool},
  };
  auto const rw = cudaMemAccessFlagsProtReadWrite;
  auto const r  = cudaMemAccessFlagsProtRead;
  auto const no = cudaMemAccessFlagsProtNone;
  for (auto const& p : pools) {
    ask(p.name, p.pool, "[0 rw]", {desc(0, rw)}, s);
    ask(p.name, p.pool, "[0 r]", {desc(0, r)}, s);
    ask(p.name, p.pool, "[0 none]", {desc(0, no)}, s);
    ask(p.name, p.pool, "[0 rw, 0 rw]", {desc(0, rw), desc(0, rw)}, s);
    ask(p.name, p.pool, "[0 rw, 0 none]", {desc(0, rw), desc(0, no)}, s);
    ask(p.name, p.pool, "[0 none, 0 rw]", {desc(0, no), desc(0, rw)}, s);
    ask(p.name, p.pool, "[0 rw] again", {desc(0, rw)}, s);
  }
  for (auto const& p : pools) {
    if (p.pool != default_pool) { check(cudaMemPoolDestroy(p.pool), "cudaMemPoolDestroy"); }
  }
  check(cudaStreamDestroy(s), "stream destroy");
  std::printf("access_facts: done\n");
  return 0;
}
