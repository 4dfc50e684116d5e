// Fused LayerNorm for GPT-2's norms: forward and backward each in one pass over the rows.
//
// libtorch's LayerNorm (profiled on gpt2-125m, 16x1024 tokens, 25 norms of [16384, 768]
// bf16 per step) spends 0.9 ms in its forward kernel, 0.8 ms computing the input gradient
// and 2.0 ms computing the weight and bias gradients in a separate kernel that re-reads dy
// and x at a quarter of the memory bandwidth. Here one warp holds one row in registers
// (16-byte loads, up to four per lane: E <= 1024 bf16 or 512 fp32); the forward writes y and
// the per-row mean and 1/std; the backward reads dy and x once, writes dx, and sums the
// weight and bias gradients of its rows in registers, so those cost no extra pass (one
// small partial per block, summed on the host side of the graph).
//
// Weights come in as the fp32 masters (no per-step cast to the compute dtype) and their
// gradients go out in fp32; activations are bf16 or fp32, with fp32 arithmetic.

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "device_types.h"
#include "fused_host.h"
#include "jit.h"

namespace bench_fused {
namespace {

// Compiled once per element type and KV (16-byte vectors per lane), which the host prepends
// as macros: ELEM (Bf16 or F32) and KV.
const char* kSource = R"CUDA(
typedef ELEM T;
typedef T::E E;
typedef T::Vec Vec;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// y = (x - mean) / sqrt(var + eps) * gamma + beta, one warp per row of `cols` elements.
extern "C" __global__ void __launch_bounds__(256)
ln_fwd(const E* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
       E* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out, int rows,
       int cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int nv = cols / T::N;
  const Vec* xv = (const Vec*)(x + (u64)row * cols);
  Vec raw[KV];
#pragma unroll
  for (int k = 0; k < KV; ++k)
    if (lane + 32 * k < nv) raw[k] = xv[lane + 32 * k];
  float f[KV][T::N];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    if (lane + 32 * k < nv) {
      T::unpack(raw[k], f[k]);
    } else {
#pragma unroll
      for (int j = 0; j < T::N; ++j) f[k][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < T::N; ++j) s += f[k][j];
  }
  const float mean = warp_sum(s) / cols;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < KV; ++k)
    if (lane + 32 * k < nv) {
#pragma unroll
      for (int j = 0; j < T::N; ++j) {
        float d = f[k][j] - mean;
        q += d * d;
      }
    }
  const float rstd = rsqrtf(warp_sum(q) / cols + eps);
  Vec* yv = (Vec*)(y + (u64)row * cols);
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int v = lane + 32 * k;
    if (v < nv) {
      float g[T::N], b[T::N], o[T::N];
      load_w<T>(gamma, v, g);
      load_w<T>(beta, v, b);
#pragma unroll
      for (int j = 0; j < T::N; ++j) o[j] = (f[k][j] - mean) * rstd * g[j] + b[j];
      yv[v] = T::pack(o);
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma and
// xhat = (x - mean) * rstd; each block also writes its rows' sums of dy * xhat (the weight
// gradient) and dy (the bias gradient) to partial[blockIdx.x] = [2, cols]. Warps stride
// over the rows, keeping their column sums in registers (each lane owns fixed columns).
extern "C" __global__ void __launch_bounds__(256)
ln_bwd(const E* __restrict__ dy, const E* __restrict__ x, const float* __restrict__ gamma,
       const float* __restrict__ mean, const float* __restrict__ rstd, E* __restrict__ dx,
       float* __restrict__ partial, int rows, int cols) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int nv = cols / T::N;
  float ag[KV][T::N], ab[KV][T::N];
#pragma unroll
  for (int k = 0; k < KV; ++k)
#pragma unroll
    for (int j = 0; j < T::N; ++j) ag[k][j] = ab[k][j] = 0.f;

  for (int row = blockIdx.x * nw + warp; row < rows; row += gridDim.x * nw) {
    const Vec* dyv = (const Vec*)(dy + (u64)row * cols);
    const Vec* xv = (const Vec*)(x + (u64)row * cols);
    Vec rd[KV], rx[KV];
#pragma unroll
    for (int k = 0; k < KV; ++k)
      if (lane + 32 * k < nv) {
        rd[k] = dyv[lane + 32 * k];
        rx[k] = xv[lane + 32 * k];
      }
    const float m = mean[row], r = rstd[row];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = lane + 32 * k;
      if (v < nv) {
        float d[T::N], xx[T::N], g[T::N];
        T::unpack(rd[k], d);
        T::unpack(rx[k], xx);
        load_w<T>(gamma, v, g);
#pragma unroll
        for (int j = 0; j < T::N; ++j) {
          const float xh = (xx[j] - m) * r;
          const float gd = d[j] * g[j];
          s1 += gd;
          s2 += gd * xh;
          ag[k][j] += d[j] * xh;
          ab[k][j] += d[j];
        }
      }
    }
    s1 = warp_sum(s1) / cols;
    s2 = warp_sum(s2) / cols;
    Vec* dxv = (Vec*)(dx + (u64)row * cols);
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = lane + 32 * k;
      if (v < nv) {
        float d[T::N], xx[T::N], g[T::N], o[T::N];
        T::unpack(rd[k], d);
        T::unpack(rx[k], xx);
        load_w<T>(gamma, v, g);
#pragma unroll
        for (int j = 0; j < T::N; ++j) {
          const float xh = (xx[j] - m) * r;
          o[j] = r * (d[j] * g[j] - s1 - xh * s2);
        }
        dxv[v] = T::pack(o);
      }
    }
  }

  // The block's column sums: the warps add theirs into shared memory in turn, then the
  // block writes them out. 2 * cols floats of dynamic shared memory.
  extern __shared__ float sh[];
  for (int i = threadIdx.x; i < 2 * cols; i += blockDim.x) sh[i] = 0.f;
  __syncthreads();
  for (int w = 0; w < nw; ++w) {
    if (warp == w) {
#pragma unroll
      for (int k = 0; k < KV; ++k) {
        const int v = lane + 32 * k;
        if (v < nv) {
#pragma unroll
          for (int j = 0; j < T::N; ++j) {
            sh[v * T::N + j] += ag[k][j];
            sh[cols + v * T::N + j] += ab[k][j];
          }
        }
      }
    }
    __syncthreads();
  }
  float* out = partial + (u64)blockIdx.x * 2 * cols;
  for (int i = threadIdx.x; i < 2 * cols; i += blockDim.x) out[i] = sh[i];
}
)CUDA";

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxVectorsPerLane = 4;

// ln_fwd and ln_bwd for this element type and row width.
const std::vector<cudaKernel_t>& ln_kernels(at::ScalarType t, int64_t cols, int device) {
  const bool bf16 = t == at::kBFloat16;
  const int64_t kv = (cols / vec_width(t) + 31) / 32;
  std::string key = std::string("layer_norm_") + (bf16 ? "bf16" : "f32") + "_kv" +
                    std::to_string(kv);
  static const std::vector<std::string> names = {"ln_fwd", "ln_bwd"};
  return bench_jit::kernels(key, layer_norm_source(t, kv), names, device);
}

struct FusedLayerNorm : public torch::autograd::Function<FusedLayerNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias, double eps) {
    TORCH_CHECK(input.is_cuda() && input.dim() == 2,
                "fused layer norm: input must be a CUDA tensor [rows, cols]");
    TORCH_CHECK(input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kFloat,
                "fused layer norm: input must be bf16 or fp32, not ", input.scalar_type());
    const int64_t rows = input.size(0), cols = input.size(1);
    TORCH_CHECK(layer_norm_supported(input.scalar_type(), cols),
                "fused layer norm: ", cols, " columns of ", input.scalar_type(),
                " are not supported (a multiple of the 16-byte vector, at most ",
                32 * kMaxVectorsPerLane, " vectors)");
    TORCH_CHECK(weight.numel() == cols && bias.numel() == cols,
                "fused layer norm: weight and bias must have ", cols, " elements");
    TORCH_CHECK(rows < (int64_t(1) << 31) / kWarpsPerBlock, "fused layer norm: too many rows");
    c10::cuda::CUDAGuard guard(input.device());
    auto x = aligned_contiguous(input);
    auto g = aligned_contiguous(weight.to(at::kFloat));
    auto b = aligned_contiguous(bias.to(at::kFloat));
    auto y = at::empty_like(x);
    auto opts = x.options().dtype(at::kFloat);
    auto mean = at::empty({rows}, opts);
    auto rstd = at::empty({rows}, opts);
    if (rows > 0) {
      const auto& ks = ln_kernels(x.scalar_type(), cols, x.get_device());
      const void* xp = x.data_ptr();
      const void* gp = g.data_ptr();
      const void* bp = b.data_ptr();
      void* yp = y.data_ptr();
      void* mp = mean.data_ptr();
      void* rp = rstd.data_ptr();
      int r = static_cast<int>(rows), c = static_cast<int>(cols);
      float e = static_cast<float>(eps);
      void* args[] = {&xp, &gp, &bp, &yp, &mp, &rp, &r, &c, &e};
      const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      bench_jit::launch(ks[0], dim3(blocks), dim3(32 * kWarpsPerBlock), args, 0,
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    }
    ctx->save_for_backward({x, g, mean, rstd});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto& x = saved[0];
    auto& g = saved[1];
    auto& mean = saved[2];
    auto& rstd = saved[3];
    c10::cuda::CUDAGuard guard(x.device());
    auto dy = aligned_contiguous(grads[0].to(x.scalar_type()));
    const int64_t rows = x.size(0), cols = x.size(1);
    auto dx = at::empty_like(x);
    // Enough blocks to fill the device twice over, each striding over rows: more rows per
    // block means fewer partial sums to add up afterwards.
    const int64_t sms = at::cuda::getDeviceProperties(x.get_device())->multiProcessorCount;
    const int64_t blocks =
        std::max<int64_t>(1, std::min((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 2 * sms));
    auto partial = at::empty({blocks, 2, cols}, x.options().dtype(at::kFloat));
    if (rows > 0) {
      const auto& ks = ln_kernels(x.scalar_type(), cols, x.get_device());
      const void* dyp = dy.data_ptr();
      const void* xp = x.data_ptr();
      const void* gp = g.data_ptr();
      const void* mp = mean.data_ptr();
      const void* rp = rstd.data_ptr();
      void* dxp = dx.data_ptr();
      void* pp = partial.data_ptr();
      int r = static_cast<int>(rows), c = static_cast<int>(cols);
      void* args[] = {&dyp, &xp, &gp, &mp, &rp, &dxp, &pp, &r, &c};
      bench_jit::launch(ks[1], dim3(static_cast<unsigned>(blocks)),
                        dim3(32 * kWarpsPerBlock), args, 2 * cols * sizeof(float),
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    } else {
      partial.zero_();
    }
    auto sums = partial.sum(0);
    auto wt = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    auto bt = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    return {dx, sums[0].to(wt), sums[1].to(bt), at::Tensor()};
  }
};

}  // namespace

bool layer_norm_supported(at::ScalarType t, int64_t cols) {
  if (t != at::kBFloat16 && t != at::kFloat) return false;
  const int64_t n = vec_width(t);
  return cols > 0 && cols % n == 0 && cols / n <= 32 * kMaxVectorsPerLane;
}

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps) {
  return FusedLayerNorm::apply(input, weight, bias, eps);
}

std::string layer_norm_source(at::ScalarType t, int64_t kv) {
  return std::string("#define ELEM ") + (t == at::kBFloat16 ? "Bf16" : "F32") + "\n#define KV " +
         std::to_string(kv) + "\n" + device_types_source() + kSource;
}

}  // namespace bench_fused
