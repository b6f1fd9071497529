// What a managed pool reports for memory it hands out again (ci/gpu.sh probe, PROBES=reuse):
// asyncmr keeps closed managed pools and reuses them, and the whole Python suite then read a
// mixed last-prefetch location (cudaInvalidDeviceId) for a 2 MiB block just prefetched whole.
//
//   reuse_facts
//
// For each first target (host, device), with and without a trim to 0 in between, and with and
// without a discard of the first block before its free: a 2 MiB block is allocated, prefetched
// to the first target, freed and the stream synchronized; then a second 2 MiB block (same
// address or not, printed) is prefetched to the other target, the stream synchronized, and
// cudaMemRangeAttributeLastPrefetchLocation read over the whole block and over each 64 KiB.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>

static int last_prefetch(void* p, size_t n)
{
  int v = 0;
  cudaError_t e = cudaMemRangeGetAttribute(&v, sizeof v, cudaMemRangeAttributeLastPrefetchLocation,
                                           p, n);
  return e == cudaSuccess ? v : -100 - static_cast<int>(e);
}

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaFree(0);
  size_t const n = 2u << 20, piece = 64u << 10;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMemLocation const host{cudaMemLocationTypeHost, 0}, dev{cudaMemLocationTypeDevice, 0};
  for (int first_host = 0; first_host < 2; ++first_host) {
    for (int trim = 0; trim < 2; ++trim) {
      for (int discard = 0; discard < 2; ++discard) {
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypeManaged;
        props.location  = dev;
        cudaMemPool_t pool;
        if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) { printf("create refused\n"); return 1; }
        void* a = nullptr;
        cudaMallocFromPoolAsync(&a, n, pool, s);
        cudaMemPrefetchAsync(a, n, first_host ? host : dev, 0, s);
        if (discard) {
          void* ptrs[] = {a};
          size_t sizes[] = {n};
          cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s);
        }
        cudaFreeAsync(a, s);
        cudaStreamSynchronize(s);
        if (trim) { cudaMemPoolTrimTo(pool, 0); }
        void* b = nullptr;
        cudaMallocFromPoolAsync(&b, n, pool, s);
        cudaError_t const e = cudaMemPrefetchAsync(b, n, first_host ? dev : host, 0, s);
        cudaStreamSynchronize(s);
        int const want = first_host ? 0 : cudaCpuDeviceId;
        int mixed = 0;
        for (size_t off = 0; off < n; off += piece) {
          if (last_prefetch(static_cast<char*>(b) + off, piece) != want) { ++mixed; }
        }
        printf("first %s, trim %d, discard %d: same address %d, prefetch %s, whole block reads "
               "%d (want %d), %d of 32 pieces read otherwise\n",
               first_host ? "host" : "device", trim, discard, a == b, cudaGetErrorName(e),
               last_prefetch(b, n), want, mixed);
        cudaFreeAsync(b, s);
        cudaStreamSynchronize(s);
        cudaMemPoolDestroy(pool);
      }
    }
  }
  return 0;
}
