// Fused SwiGLU for the Llama MLP: silu(a) * b forward in one pass, and its backward in one.
//
// libtorch runs it as three elementwise passes forward (silu, then the product; both write
// a [tokens, ffn] tensor) and saves silu(a) as a third activation; its backward computes the
// two products and silu's backward in separate passes (about nine [tokens, ffn] tensors read
// or written; at the Llama proxy's [8192, 14336] bf16, 235 MB each). Here the forward reads
// a and b and writes y; the backward reads dy, a and b and writes da and db, recomputing
// silu(a) in registers, so only a and b are saved. fp32 arithmetic on bf16 or fp32 tensors.

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "device_types.h"
#include "fused_host.h"
#include "jit.h"

namespace bench_fused {
namespace {

// ELEM (Bf16 or F32) is prepended by the host.
const char* kSource = R"CUDA(
typedef ELEM T;
typedef T::E E;
typedef T::Vec Vec;

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + __expf(-z)); }

// y = silu(a) * b over nvec 16-byte vectors.
extern "C" __global__ void __launch_bounds__(256)
swiglu_fwd(const E* __restrict__ a, const E* __restrict__ b, E* __restrict__ y, u64 nvec) {
  const Vec* av = (const Vec*)a;
  const Vec* bv = (const Vec*)b;
  Vec* yv = (Vec*)y;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < nvec;
       i += (u64)gridDim.x * blockDim.x) {
    float fa[T::N], fb[T::N];
    T::unpack(av[i], fa);
    T::unpack(bv[i], fb);
#pragma unroll
    for (int j = 0; j < T::N; ++j) fa[j] = fa[j] * sigmoid(fa[j]) * fb[j];
    yv[i] = T::pack(fa);
  }
}

// da = dy * b * sig(a) * (1 + a * (1 - sig(a))), db = dy * silu(a).
extern "C" __global__ void __launch_bounds__(256)
swiglu_bwd(const E* __restrict__ dy, const E* __restrict__ a, const E* __restrict__ b,
           E* __restrict__ da, E* __restrict__ db, u64 nvec) {
  const Vec* dv = (const Vec*)dy;
  const Vec* av = (const Vec*)a;
  const Vec* bv = (const Vec*)b;
  Vec* dav = (Vec*)da;
  Vec* dbv = (Vec*)db;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < nvec;
       i += (u64)gridDim.x * blockDim.x) {
    float fd[T::N], fa[T::N], fb[T::N], oa[T::N], ob[T::N];
    T::unpack(dv[i], fd);
    T::unpack(av[i], fa);
    T::unpack(bv[i], fb);
#pragma unroll
    for (int j = 0; j < T::N; ++j) {
      const float s = sigmoid(fa[j]);
      ob[j] = fd[j] * fa[j] * s;
      oa[j] = fd[j] * fb[j] * s * (1.f + fa[j] * (1.f - s));
    }
    dav[i] = T::pack(oa);
    dbv[i] = T::pack(ob);
  }
}
)CUDA";

const std::vector<cudaKernel_t>& swiglu_kernels(at::ScalarType t, int device) {
  const bool bf16 = t == at::kBFloat16;
  static const std::vector<std::string> names = {"swiglu_fwd", "swiglu_bwd"};
  return bench_jit::kernels(std::string("swiglu_") + (bf16 ? "bf16" : "f32"), swiglu_source(t),
                            names, device);
}

struct FusedSwiglu : public torch::autograd::Function<FusedSwiglu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    TORCH_CHECK(gate.is_cuda() && up.device() == gate.device(),
                "fused SwiGLU: both inputs must be CUDA tensors on one device");
    TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
                "fused SwiGLU: inputs differ in shape or dtype");
    TORCH_CHECK(swiglu_supported(gate.scalar_type(), gate.dim() > 0 ? gate.size(-1) : 0),
                "fused SwiGLU: rows of ", gate.scalar_type(), " are not supported");
    c10::cuda::CUDAGuard guard(gate.device());
    auto a = aligned_contiguous(gate);
    auto b = aligned_contiguous(up);
    auto y = at::empty_like(a);
    const uint64_t nvec = static_cast<uint64_t>(a.numel() / vec_width(a.scalar_type()));
    if (nvec > 0) {
      const auto& ks = swiglu_kernels(a.scalar_type(), a.get_device());
      const void* ap = a.data_ptr();
      const void* bp = b.data_ptr();
      void* yp = y.data_ptr();
      unsigned long long n = nvec;
      void* args[] = {&ap, &bp, &yp, &n};
      bench_jit::launch(ks[0], dim3(grid_for(nvec, a.get_device())), dim3(256), args, 0,
                        at::cuda::getCurrentCUDAStream(a.get_device()).stream());
    }
    ctx->save_for_backward({a, b});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto& a = saved[0];
    auto& b = saved[1];
    c10::cuda::CUDAGuard guard(a.device());
    auto dy = aligned_contiguous(grads[0].to(a.scalar_type()));
    auto da = at::empty_like(a);
    auto db = at::empty_like(b);
    const uint64_t nvec = static_cast<uint64_t>(a.numel() / vec_width(a.scalar_type()));
    if (nvec > 0) {
      const auto& ks = swiglu_kernels(a.scalar_type(), a.get_device());
      const void* dp = dy.data_ptr();
      const void* ap = a.data_ptr();
      const void* bp = b.data_ptr();
      void* dap = da.data_ptr();
      void* dbp = db.data_ptr();
      unsigned long long n = nvec;
      void* args[] = {&dp, &ap, &bp, &dap, &dbp, &n};
      bench_jit::launch(ks[1], dim3(grid_for(nvec, a.get_device())), dim3(256), args, 0,
                        at::cuda::getCurrentCUDAStream(a.get_device()).stream());
    }
    return {da, db};
  }
};

}  // namespace

bool swiglu_supported(at::ScalarType t, int64_t cols) {
  if (t != at::kBFloat16 && t != at::kFloat) return false;
  return cols > 0 && cols % vec_width(t) == 0;
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return FusedSwiglu::apply(gate, up);
}

std::string swiglu_source(at::ScalarType t) {
  return std::string("#define ELEM ") + (t == at::kBFloat16 ? "Bf16" : "F32") + "\n" +
         device_types_source() + kSource;
}

}  // namespace bench_fused
