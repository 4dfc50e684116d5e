// Run-time compilation of the shim's own CUDA kernels: CUDA C++ source compiled by NVRTC to
// a cubin for the device's own architecture, loaded through the CUDA runtime's library API
// and launched on the caller's stream.
//
// Neither libnvrtc nor libcuda is linked. The torch wheel ships libnvrtc.so.13 beside the
// CUDA runtime we already link (site-packages/nvidia/cu13/lib), and it is opened with dlopen
// on first use, the way ATen's own lazy NVRTC stub opens it. (That stub's struct of function
// pointers, at::cuda::NVRTC, is declared in ATen/cuda/nvrtc_stub/ATenNVRTC.h, which the wheel
// does not ship; copying its layout would be an ABI guess that a torch upgrade could break
// silently.) Loading and launching go through the CUDA runtime (cudaLibraryLoadData,
// cudaLibraryGetKernel, cudaLaunchKernel), so a host without a GPU never touches the driver.

#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace bench_jit {

// Compiles `source` (no #include of CUDA headers: NVRTC's built-ins only) for sm_<arch>,
// e.g. 90 for the H100, and returns the cubin. Throws with NVRTC's log on failure. Needs no
// GPU, so a CPU test can check that the kernels compile.
std::string compile_cubin(const std::string& source, const std::string& name, int arch);

// The kernels `names` of `source`, compiled once per process and architecture and loaded
// once per device. Returned in the order of `names`. `key` names the source in the cache
// (one key, one source). The first call on a device compiles; later calls are a map lookup.
const std::vector<cudaKernel_t>& kernels(const std::string& key, const std::string& source,
                                         const std::vector<std::string>& names, int device);

// Launches `k` with `smem` bytes of dynamic shared memory on `stream` (capturable: a plain
// kernel node under CUDA-graph capture).
void launch(cudaKernel_t k, dim3 grid, dim3 block, void** args, size_t smem,
            cudaStream_t stream);

}  // namespace bench_jit
