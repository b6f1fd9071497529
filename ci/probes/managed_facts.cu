// What cudaMemAdvise does on managed pool memory, kind by kind (ci/gpu.sh probe): on a pool
// located on the device, one located on the host, and cudaMallocManaged memory for comparison.
// One line per (memory, advice, target): the driver's answer, and whether the context still
// works after it (a memset and a synchronization).
#include <cuda_runtime.h>
#include <cstdio>

static const char* works(cudaStream_t s, void* p)
{
  cudaGetLastError();
  if (cudaMemsetAsync(p, 1, 4096, s) != cudaSuccess) return "context BROKEN (memset)";
  if (cudaStreamSynchronize(s) != cudaSuccess) return "context BROKEN (sync)";
  return "context fine";
}

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaFree(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  struct memory { const char* name; void* p; } mem[3] = {};
  const size_t n = 2 << 20;
  for (int k = 0; k < 2; ++k) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypeManaged;
    props.location  = k == 0 ? cudaMemLocation{cudaMemLocationTypeDevice, 0}
                             : cudaMemLocation{cudaMemLocationTypeHost, 0};
    cudaMemPool_t pool;
    cudaError_t e = cudaMemPoolCreate(&pool, &props);
    mem[k].name = k == 0 ? "managed pool @device0" : "managed pool @host";
    if (e == cudaSuccess && k == 1) {
      cudaMemAccessDesc d{{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
      cudaMemPoolSetAccess(pool, &d, 1);
    }
    if (e == cudaSuccess) e = cudaMallocFromPoolAsync(&mem[k].p, n, pool, s);
    cudaStreamSynchronize(s);
    if (e != cudaSuccess) { printf("%s: could not allocate: %s\n", mem[k].name, cudaGetErrorName(e)); mem[k].p = nullptr; cudaGetLastError(); }
  }
  mem[2].name = "cudaMallocManaged";
  cudaMallocManaged(&mem[2].p, n);
  struct advice { const char* name; cudaMemoryAdvise a; } advices[] = {
    {"SetReadMostly", cudaMemAdviseSetReadMostly},
    {"UnsetReadMostly", cudaMemAdviseUnsetReadMostly},
    {"SetPreferredLocation", cudaMemAdviseSetPreferredLocation},
    {"UnsetPreferredLocation", cudaMemAdviseUnsetPreferredLocation},
    {"SetAccessedBy", cudaMemAdviseSetAccessedBy},
    {"UnsetAccessedBy", cudaMemAdviseUnsetAccessedBy},
  };
  cudaMemLocation targets[2] = {{cudaMemLocationTypeDevice, 0}, {cudaMemLocationTypeHost, 0}};
  for (auto& m : mem) {
    if (m.p == nullptr) continue;
    for (auto& a : advices) {
      for (auto& t : targets) {
        cudaError_t e = cudaMemAdvise(m.p, n, a.a, t);
        printf("advise %-22s %-22s to %-6s: %-28s %s\n", m.name, a.name,
               t.type == cudaMemLocationTypeDevice ? "dev0" : "host", cudaGetErrorName(e), works(s, m.p));
      }
    }
  }
  printf("managed facts done\n");
  return 0;
}
