// What the driver does with a pool destroyed while a stream-ordered free of one of its blocks has
// not run yet (ci/gpu.sh probe). The stream is held back by a host function that sleeps, so the
// free is queued but not executed when the counters are read and the pool destroyed.
//   pool_destroy_facts            the counters: used, reserved after a trim to 0, before and
//                                 after the stream ran the free
//   pool_destroy_facts destroy    destroys the pool with the free still queued, then waits for
//                                 the stream: run it under `timeout` (it may never return)
#include <cuda_runtime.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>

static void CUDART_CB hold(void*) { usleep(300 * 1000); }

static unsigned long long attr(cudaMemPool_t p, cudaMemPoolAttr a)
{
  unsigned long long v = ~0ULL;
  if (cudaMemPoolGetAttribute(p, a, &v) != cudaSuccess) { printf("attribute %d refused\n", (int)a); }
  return v;
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  bool const destroy = argc > 1 && std::strcmp(argv[1], "destroy") == 0;
  cudaFree(0);
  cudaMemPoolProps props{};
  props.allocType     = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id   = 0;
  cudaMemPool_t pool;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) { printf("FAIL create\n"); return 1; }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaLaunchHostFunc(s, hold, nullptr);
  void* p = nullptr;
  cudaMallocFromPoolAsync(&p, 4096, pool, s);
  cudaFreeAsync(p, s);
  cudaMemPoolTrimTo(pool, 0);
  printf("free queued: used %llu, reserved after trim_to(0) %llu, stream %s\n",
         attr(pool, cudaMemPoolAttrUsedMemCurrent), attr(pool, cudaMemPoolAttrReservedMemCurrent),
         cudaStreamQuery(s) == cudaErrorNotReady ? "not done" : "done");
  if (destroy) {
    printf("destroy with the free queued: %s\n", cudaGetErrorName(cudaMemPoolDestroy(pool)));
    printf("synchronizing the stream...\n");
    printf("synchronized: %s\n", cudaGetErrorName(cudaStreamSynchronize(s)));
    return 0;
  }
  cudaStreamSynchronize(s);
  cudaMemPoolTrimTo(pool, 0);
  printf("free ran:    used %llu, reserved after trim_to(0) %llu\n",
         attr(pool, cudaMemPoolAttrUsedMemCurrent), attr(pool, cudaMemPoolAttrReservedMemCurrent));
  printf("destroy: %s\n", cudaGetErrorName(cudaMemPoolDestroy(pool)));
  printf("probe done\n");
  return 0;
}
