// Whether driver calls on one thread race a managed pool's create and destroy on another
// (ci/gpu.sh probe, PROBES=race). Each pool here has held nothing since its stream was
// synchronized, and no stream is destroyed with work queued: the hazard
// ci/probes/retire_facts.cu "thread" shows is kept out, so a crash here is the pair's.
//
//   race_facts OP POOLS SECONDS
//     OP     what the main thread repeats, on its own memory and stream:
//              prefetch        cudaMemPrefetchAsync of a block of a long-lived managed pool
//              prefetch-malloc cudaMemPrefetchAsync of cudaMallocManaged memory
//              advise          cudaMemAdvise(set/unset preferred location) of a managed pool block
//              alloc-free      cudaMallocFromPoolAsync + cudaFreeAsync on a long-lived managed pool
//              nothing         sleeps (the second thread alone)
//     POOLS  what the second thread creates, uses (a 4 KiB block allocated, freed and its stream
//            synchronized, so that the pool holds nothing) and destroys, over and over:
//              managed | device | pinned | managed-unused (created and destroyed, never used)
//              | managed-keep (created and used, never destroyed)
//
// Prints how many of each it did and the errors the main thread's calls returned, and a line
// every 256 pool cycles; a crash ends the process (the shell reports the signal). "nothing
// managed-keep" asks whether many live managed pools alone end the process.
#include <cuda_runtime.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static cudaMemPool_t make_pool(cudaMemAllocationType type, cudaMemLocationType where)
{
  cudaMemPoolProps props{};
  props.allocType = type;
  props.location  = cudaMemLocation{where, 0};
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) { printf("create refused\n"); }
  return pool;
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 4) { fprintf(stderr, "usage: race_facts OP POOLS SECONDS\n"); return 2; }
  std::string const op = argv[1], pools = argv[2];
  double const seconds = atof(argv[3]);
  cudaFree(0);
  std::atomic<bool> stop{false};
  std::atomic<long> cycles{0};
  std::vector<cudaMemPool_t> kept;
  std::thread second{[&] {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    bool const managed = pools.rfind("managed", 0) == 0;
    auto const type    = managed ? cudaMemAllocationTypeManaged : cudaMemAllocationTypePinned;
    auto const where   = pools == "pinned" ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    while (!stop.load()) {
      cudaMemPool_t pool = make_pool(type, where);
      if (pools == "pinned") {
        cudaMemAccessDesc d{{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
        cudaMemPoolSetAccess(pool, &d, 1);
      }
      if (pools != "managed-unused") {
        void* p = nullptr;
        cudaMallocFromPoolAsync(&p, 4096, pool, s);
        cudaFreeAsync(p, s);
        cudaStreamSynchronize(s);
        cudaMemPoolTrimTo(pool, 0);
      }
      if (pools == "managed-keep") {
        kept.push_back(pool);
      } else if (cudaMemPoolDestroy(pool) != cudaSuccess) {
        printf("destroy refused\n");
      }
      if ((cycles.fetch_add(1) + 1) % 256 == 0) { printf("%ld pool cycles\n", cycles.load()); }
    }
    cudaStreamDestroy(s);
  }};
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMemPool_t own = make_pool(cudaMemAllocationTypeManaged, cudaMemLocationTypeDevice);
  std::size_t const n = (1 << 20) + 512;
  void* block = nullptr;
  if (op == "prefetch-malloc") {
    cudaMallocManaged(&block, n);
  } else {
    cudaMallocFromPoolAsync(&block, n, own, s);
  }
  cudaStreamSynchronize(s);
  long calls = 0, errors = 0;
  cudaError_t first = cudaSuccess;
  auto const end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    cudaError_t e = cudaSuccess;
    cudaMemLocation dev{cudaMemLocationTypeDevice, 0}, host{cudaMemLocationTypeHost, 0};
    if (op == "prefetch" || op == "prefetch-malloc") {
      e = cudaMemPrefetchAsync(block, n, (calls & 1) ? host : dev, 0, s);
    } else if (op == "advise") {
      e = cudaMemAdvise(block, n, (calls & 1) ? cudaMemAdviseUnsetPreferredLocation
                                              : cudaMemAdviseSetPreferredLocation, dev);
    } else if (op == "alloc-free") {
      void* p = nullptr;
      e = cudaMallocFromPoolAsync(&p, 4096, own, s);
      if (e == cudaSuccess) { e = cudaFreeAsync(p, s); }
    } else {
      usleep(1000);
    }
    if (e != cudaSuccess) {
      if (errors++ == 0) { first = e; }
      cudaGetLastError();
    }
    if ((++calls & 255) == 0) { cudaStreamSynchronize(s); }
  }
  stop = true;
  second.join();
  cudaError_t const synced = cudaDeviceSynchronize();
  printf("race %s | %s: %ld calls, %ld refused (first %s), %ld pool cycles, synchronize %s\n",
         op.c_str(), pools.c_str(), calls, errors, cudaGetErrorName(first), cycles.load(),
         cudaGetErrorName(synced));
  return 0;
}
