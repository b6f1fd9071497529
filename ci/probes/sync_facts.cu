// What a device synchronization on one thread does to a stream capture on another, and whether
// it waits for the work of a stream destroyed with that work queued (ci/gpu.sh probe,
// PROBES=sync). asyncmr's sweeper synchronizes the device before it destroys a managed pool.
//
//   sync_facts
//
// For each capture mode of the capturing thread (global, thread-local, relaxed) and each mode
// of the synchronizing thread (global, relaxed), one line: what cudaDeviceSynchronize returned
// while the capture was open, and what ending the capture and instantiating its graph returned.
// Then one line: how long cudaDeviceSynchronize took after a stream holding a 300 ms host
// function was destroyed.
#include <cuda_runtime.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

static char const* mode_name(cudaStreamCaptureMode m)
{
  return m == cudaStreamCaptureModeGlobal ? "global"
         : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

static void CUDART_CB hold(void*) { usleep(300 * 1000); }

int main()
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaFree(0);
  void* block = nullptr;
  cudaMalloc(&block, 4096);
  cudaStreamCaptureMode const modes[] = {cudaStreamCaptureModeGlobal,
                                         cudaStreamCaptureModeThreadLocal,
                                         cudaStreamCaptureModeRelaxed};
  for (auto capture_mode : modes) {
    for (auto sync_mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed}) {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::atomic<int> step{0};
      cudaError_t synced = cudaSuccess;
      std::thread other{[&] {
        while (step.load() != 1) { std::this_thread::yield(); }
        cudaStreamCaptureMode m = sync_mode;
        cudaThreadExchangeStreamCaptureMode(&m);
        synced = cudaDeviceSynchronize();
        cudaGetLastError();
        step = 2;
      }};
      cudaError_t const begun = cudaStreamBeginCapture(s, capture_mode);
      cudaMemsetAsync(block, 0, 4096, s);
      step = 1;
      while (step.load() != 2) { std::this_thread::yield(); }
      cudaMemsetAsync(block, 1, 4096, s);
      cudaGraph_t graph = nullptr;
      cudaError_t const ended = cudaStreamEndCapture(s, &graph);
      cudaGraphExec_t exec = nullptr;
      cudaError_t const made = graph ? cudaGraphInstantiate(&exec, graph, 0) : cudaErrorUnknown;
      cudaGetLastError();
      other.join();
      printf("capture %s, synchronizing thread %s: begin %s, cudaDeviceSynchronize %s, "
             "end capture %s, instantiate %s\n", mode_name(capture_mode), mode_name(sync_mode),
             cudaGetErrorName(begun), cudaGetErrorName(synced), cudaGetErrorName(ended),
             graph ? cudaGetErrorName(made) : "(no graph)");
      if (exec) { cudaGraphExecDestroy(exec); }
      if (graph) { cudaGraphDestroy(graph); }
      cudaStreamDestroy(s);
    }
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaLaunchHostFunc(s, hold, nullptr);
  cudaStreamDestroy(s);
  auto const t0 = std::chrono::steady_clock::now();
  cudaError_t const e = cudaDeviceSynchronize();
  auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  printf("destroyed stream with a 300 ms host function queued: cudaDeviceSynchronize %s after %.0f ms\n",
         cudaGetErrorName(e), ms);
  return 0;
}
