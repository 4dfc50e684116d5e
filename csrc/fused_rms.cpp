// Fused RMSNorm for the Llama blocks: forward and backward each in one pass over the rows,
// the weight gradient folded into the input-gradient pass.
//
// libtorch's rms_norm (the Llama proxy runs nine of [8192, 4096] bf16 per step) computes the
// norm in several elementwise and reduction passes through fp32 temporaries, and its
// backward more, plus a column sum for the weight gradient that re-reads dy and x. Here one
// block of TPB threads owns one row (16-byte loads, KV vectors per thread held in
// registers): the forward reads x once and writes y and the row's 1/rms; the backward reads
// dy and x once, writes dx, and each thread sums the weight gradient of its own columns over
// the rows its block visits (blocks stride over rows), so that gradient costs one small
// partial per block, summed on the host side of the graph.
//
// Weights come in as the fp32 masters (or bf16 working weights under DDP/FSDP: cast to fp32
// here, a few KB) and their gradient goes out in the weight's own dtype; activations are bf16
// or fp32, with fp32 arithmetic.

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "device_types.h"
#include "fused_host.h"
#include "jit.h"

namespace bench_fused {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxVectorsPerThread = 8;

// ELEM (Bf16 or F32), KV (vectors per thread) and TPB (threads per block) are prepended by
// the host.
const char* kSource = R"CUDA(
typedef ELEM T;
typedef T::E E;
typedef T::Vec Vec;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of v over the block, returned to every thread; `sh` holds TPB / 32 floats. Ends
// with a barrier so that the next call may reuse `sh`.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < TPB / 32; ++w) s += sh[w];
  __syncthreads();
  return s;
}

// y = x / sqrt(mean(x^2) + eps) * w, one block per row of `cols` elements.
extern "C" __global__ void __launch_bounds__(TPB)
rms_fwd(const E* __restrict__ x, const float* __restrict__ w, E* __restrict__ y,
        float* __restrict__ rstd_out, int cols, float eps) {
  __shared__ float sh[TPB / 32];
  const u64 row = blockIdx.x;
  const int nv = cols / T::N;
  const Vec* xv = (const Vec*)(x + row * cols);
  float f[KV][T::N];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int v = threadIdx.x + TPB * k;
    if (v < nv) {
      T::unpack(xv[v], f[k]);
    } else {
#pragma unroll
      for (int j = 0; j < T::N; ++j) f[k][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < T::N; ++j) s += f[k][j] * f[k][j];
  }
  const float rstd = rsqrtf(block_sum(s, sh) / cols + eps);
  Vec* yv = (Vec*)(y + row * cols);
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int v = threadIdx.x + TPB * k;
    if (v < nv) {
      float g[T::N], o[T::N];
      load_w<T>(w, v, g);
#pragma unroll
      for (int j = 0; j < T::N; ++j) o[j] = f[k][j] * rstd * g[j];
      yv[v] = T::pack(o);
    }
  }
  if (threadIdx.x == 0) rstd_out[row] = rstd;
}

// dx = rstd * (dy * w - xhat * mean(dy * w * xhat)) with xhat = x * rstd; the block also
// writes its rows' sums of dy * xhat (the weight gradient) to partial[blockIdx.x] = [cols].
// Each thread owns fixed columns, so it keeps their sums in registers and writes them out
// at the end without any exchange.
extern "C" __global__ void __launch_bounds__(TPB)
rms_bwd(const E* __restrict__ dy, const E* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ rstd, E* __restrict__ dx, float* __restrict__ partial,
        int rows, int cols) {
  __shared__ float sh[TPB / 32];
  const int nv = cols / T::N;
  float aw[KV][T::N];
#pragma unroll
  for (int k = 0; k < KV; ++k)
#pragma unroll
    for (int j = 0; j < T::N; ++j) aw[k][j] = 0.f;

  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const Vec* dyv = (const Vec*)(dy + (u64)row * cols);
    const Vec* xv = (const Vec*)(x + (u64)row * cols);
    Vec rd[KV], rx[KV];
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = threadIdx.x + TPB * k;
      if (v < nv) {
        rd[k] = dyv[v];
        rx[k] = xv[v];
      }
    }
    const float r = rstd[row];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = threadIdx.x + TPB * k;
      if (v < nv) {
        float d[T::N], xx[T::N], g[T::N];
        T::unpack(rd[k], d);
        T::unpack(rx[k], xx);
        load_w<T>(w, v, g);
#pragma unroll
        for (int j = 0; j < T::N; ++j) {
          const float xh = xx[j] * r;
          s += d[j] * g[j] * xh;
          aw[k][j] += d[j] * xh;
        }
      }
    }
    s = block_sum(s, sh) / cols;
    Vec* dxv = (Vec*)(dx + (u64)row * cols);
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = threadIdx.x + TPB * k;
      if (v < nv) {
        float d[T::N], xx[T::N], g[T::N], o[T::N];
        T::unpack(rd[k], d);
        T::unpack(rx[k], xx);
        load_w<T>(w, v, g);
#pragma unroll
        for (int j = 0; j < T::N; ++j) o[j] = r * (d[j] * g[j] - xx[j] * r * s);
        dxv[v] = T::pack(o);
      }
    }
  }

  float* out = partial + (u64)blockIdx.x * cols;
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int v = threadIdx.x + TPB * k;
    if (v < nv) {
#pragma unroll
      for (int j = 0; j < T::N; ++j) out[v * T::N + j] = aw[k][j];
    }
  }
}
)CUDA";

int64_t vectors_per_thread(at::ScalarType t, int64_t cols) {
  return (cols / vec_width(t) + kThreads - 1) / kThreads;
}

// rms_fwd and rms_bwd for this element type and row width.
const std::vector<cudaKernel_t>& rms_kernels(at::ScalarType t, int64_t cols, int device) {
  const bool bf16 = t == at::kBFloat16;
  const int64_t kv = vectors_per_thread(t, cols);
  std::string key = std::string("rms_norm_") + (bf16 ? "bf16" : "f32") + "_kv" +
                    std::to_string(kv);
  static const std::vector<std::string> names = {"rms_fwd", "rms_bwd"};
  return bench_jit::kernels(key, rms_norm_source(t, kv), names, device);
}

struct FusedRmsNorm : public torch::autograd::Function<FusedRmsNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, double eps) {
    TORCH_CHECK(input.is_cuda() && input.dim() == 2,
                "fused RMSNorm: input must be a CUDA tensor [rows, cols]");
    TORCH_CHECK(input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kFloat,
                "fused RMSNorm: input must be bf16 or fp32, not ", input.scalar_type());
    const int64_t rows = input.size(0), cols = input.size(1);
    TORCH_CHECK(rms_norm_supported(input.scalar_type(), cols), "fused RMSNorm: ", cols,
                " columns of ", input.scalar_type(),
                " are not supported (a multiple of the 16-byte vector, at most ",
                kThreads * kMaxVectorsPerThread, " vectors)");
    TORCH_CHECK(weight.numel() == cols, "fused RMSNorm: weight must have ", cols, " elements");
    TORCH_CHECK(rows < (int64_t(1) << 31), "fused RMSNorm: too many rows");
    c10::cuda::CUDAGuard guard(input.device());
    auto x = aligned_contiguous(input);
    auto w = aligned_contiguous(weight.to(at::kFloat));
    auto y = at::empty_like(x);
    auto rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    if (rows > 0) {
      const auto& ks = rms_kernels(x.scalar_type(), cols, x.get_device());
      const void* xp = x.data_ptr();
      const void* wp = w.data_ptr();
      void* yp = y.data_ptr();
      void* rp = rstd.data_ptr();
      int c = static_cast<int>(cols);
      float e = static_cast<float>(eps);
      void* args[] = {&xp, &wp, &yp, &rp, &c, &e};
      bench_jit::launch(ks[0], dim3(static_cast<unsigned>(rows)), dim3(kThreads), args, 0,
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    }
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto& x = saved[0];
    auto& w = saved[1];
    auto& rstd = saved[2];
    c10::cuda::CUDAGuard guard(x.device());
    auto dy = aligned_contiguous(grads[0].to(x.scalar_type()));
    const int64_t rows = x.size(0), cols = x.size(1);
    auto dx = at::empty_like(x);
    // A few blocks per multiprocessor, each striding over rows: more rows per block means
    // fewer partial sums of the weight gradient to add up afterwards.
    const int64_t sms = at::cuda::getDeviceProperties(x.get_device())->multiProcessorCount;
    const int64_t blocks = std::max<int64_t>(1, std::min(rows, 4 * sms));
    auto partial = at::empty({blocks, cols}, x.options().dtype(at::kFloat));
    if (rows > 0) {
      const auto& ks = rms_kernels(x.scalar_type(), cols, x.get_device());
      const void* dyp = dy.data_ptr();
      const void* xp = x.data_ptr();
      const void* wp = w.data_ptr();
      const void* rp = rstd.data_ptr();
      void* dxp = dx.data_ptr();
      void* pp = partial.data_ptr();
      int r = static_cast<int>(rows), c = static_cast<int>(cols);
      void* args[] = {&dyp, &xp, &wp, &rp, &dxp, &pp, &r, &c};
      bench_jit::launch(ks[1], dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, 0,
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    } else {
      partial.zero_();
    }
    auto wt = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {dx, partial.sum(0).to(wt), at::Tensor()};
  }
};

}  // namespace

bool rms_norm_supported(at::ScalarType t, int64_t cols) {
  if (t != at::kBFloat16 && t != at::kFloat) return false;
  const int64_t n = vec_width(t);
  return cols > 0 && cols % n == 0 && cols / n <= kThreads * kMaxVectorsPerThread;
}

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  return FusedRmsNorm::apply(input, weight, eps);
}

std::string rms_norm_source(at::ScalarType t, int64_t kv) {
  return std::string("#define ELEM ") + (t == at::kBFloat16 ? "Bf16" : "F32") + "\n#define KV " +
         std::to_string(kv) + "\n#define TPB " + std::to_string(kThreads) + "\n" +
         device_types_source() + kSource;
}

}  // namespace bench_fused
