// What retiring a created pool does, pool kind by kind, after stream-ordered use that the
// driver may still be running when the pool goes (ci/gpu.sh probe, PROBES=retire).
//
//   retire_facts KIND PLACE ROUNDS [sync|nosync] [stream-first|pool-first]
//     KIND   device | pinned | managed
//     PLACE  none | device | host: a prefetch of each block before its free (managed only)
//     stream-first (default): the round's created stream is destroyed before the pool;
//     pool-first: after it (asyncmr's order when a resource is dropped before the stream it
//     used; in Python a managed pool prefetched on a fresh stream then crashed a later
//     cuMemPoolDestroy on driver 580: tests/reliability/retire_workload.py)
//
// Each round creates a pool, allocates and frees 4 KiB, 64 KiB and 1 MiB + 512 on the legacy,
// per-thread and a created stream (destroyed at once), trims the pool to 0 and reads its
// counters, then destroys it when it holds nothing (what asyncmr checks before a destroy), else
// keeps it for the next round's check. "sync" synchronizes the device before each destroy.
// One line a round where something is kept; the last line says how the run ended. Run it in a
// shell that reports the signal: a crash inside cuMemPoolDestroy ends it.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static unsigned long long attr(cudaMemPool_t p, cudaMemPoolAttr a)
{
  unsigned long long v = ~0ULL;
  cudaError_t e = cudaMemPoolGetAttribute(p, a, &v);
  if (e != cudaSuccess) { printf("  attribute %d: %s\n", (int)a, cudaGetErrorName(e)); }
  return v;
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 4) { fprintf(stderr, "usage: retire_facts KIND PLACE ROUNDS [sync]\n"); return 2; }
  const char* kind  = argv[1];
  const char* place = argv[2];
  int rounds        = atoi(argv[3]);
  bool sync         = argc > 4 && strcmp(argv[4], "sync") == 0;
  bool pool_first   = argc > 5 && strcmp(argv[5], "pool-first") == 0;
  cudaFree(0);
  // Other memory in the process, as RMM and CuPy hold it.
  void* other = nullptr;
  cudaMalloc(&other, 1 << 20);
  cudaStream_t long_lived;
  cudaStreamCreateWithFlags(&long_lived, cudaStreamNonBlocking);
  std::vector<cudaMemPool_t> kept;
  size_t sizes[] = {4096, 64 << 10, (1 << 20) + 512};
  int destroyed = 0;
  cudaError_t e = cudaSuccess;
  for (int r = 0; r < rounds; ++r) {
    cudaMemPoolProps props{};
    props.allocType = strcmp(kind, "managed") == 0 ? cudaMemAllocationTypeManaged
                                                   : cudaMemAllocationTypePinned;
    props.location  = strcmp(kind, "pinned") == 0 ? cudaMemLocation{cudaMemLocationTypeHost, 0}
                                                  : cudaMemLocation{cudaMemLocationTypeDevice, 0};
    cudaMemPool_t pool;
    e = cudaMemPoolCreate(&pool, &props);
    if (e != cudaSuccess) { printf("round %d: create %s\n", r, cudaGetErrorName(e)); return 1; }
    if (strcmp(kind, "pinned") == 0) {
      cudaMemAccessDesc d{{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
      cudaMemPoolSetAccess(pool, &d, 1);
    }
    cudaStream_t fresh;
    cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking);
    cudaStream_t streams[] = {cudaStreamLegacy, cudaStreamPerThread, long_lived, fresh};
    for (cudaStream_t s : streams) {
      for (size_t n : sizes) {
        void* p = nullptr;
        e = cudaMallocFromPoolAsync(&p, n, pool, s);
        if (e != cudaSuccess) { printf("round %d: alloc %s\n", r, cudaGetErrorName(e)); return 1; }
        if (strcmp(place, "none") != 0) {
          cudaMemLocation to = strcmp(place, "host") == 0 ? cudaMemLocation{cudaMemLocationTypeHost, 0}
                                                          : cudaMemLocation{cudaMemLocationTypeDevice, 0};
          e = cudaMemPrefetchAsync(p, n, to, 0, s);
          if (e != cudaSuccess) { printf("round %d: prefetch %s\n", r, cudaGetErrorName(e)); cudaGetLastError(); }
        }
        cudaFreeAsync(p, s);
      }
    }
    if (!pool_first) { cudaStreamDestroy(fresh); }
    kept.push_back(pool);
    if (sync) { cudaDeviceSynchronize(); }
    // asyncmr's check: used 0, and reserved 0 after a trim to 0; then destroy.
    std::vector<cudaMemPool_t> still;
    for (cudaMemPool_t k : kept) {
      cudaMemPoolTrimTo(k, 0);
      unsigned long long used = attr(k, cudaMemPoolAttrUsedMemCurrent);
      unsigned long long reserved = attr(k, cudaMemPoolAttrReservedMemCurrent);
      if (used == 0 && reserved == 0) {
        e = cudaMemPoolDestroy(k);
        if (e != cudaSuccess) { printf("round %d: destroy %s\n", r, cudaGetErrorName(e)); }
        ++destroyed;
      } else {
        printf("round %d: kept %p (used %llu, reserved %llu)\n", r, (void*)k, used, reserved);
        still.push_back(k);
      }
    }
    kept.swap(still);
    if (pool_first) { cudaStreamDestroy(fresh); }
  }
  e = cudaDeviceSynchronize();
  printf("retire %s %s %s %s: %d rounds, %d destroyed, %zu kept, synchronize %s\n", kind, place,
         sync ? "sync" : "nosync", pool_first ? "pool-first" : "stream-first", rounds, destroyed,
         kept.size(), cudaGetErrorName(e));
  return 0;
}
