// The scale-and-cast of fp8 quantization in one pass.
//
// The fp8 linear's dynamic scaling multiplied each tensor by its scale (a one-element device
// tensor) and then cast the product to fp8: two passes, and the first one slow, because a
// product with a broadcast one-element tensor takes libtorch's strided elementwise kernel
// rather than its vectorized one. Profiled on the Llama proxy in fp8 (84 quantizations a
// step) the products took 8.6 ms and the casts 4.0 ms of a 148 ms step; this kernel takes
// 3.2 ms for both. Here one kernel reads the tensor
// in 16-byte vectors and the scale once per thread, and writes the fp8 values with the PTX
// conversion (sm_89 and later; the fp8 path needs such a GPU anyway).
//
// The conversion saturates where libtorch's cast does not. Under dynamic scaling the scale
// is a power of two chosen so that |t * scale| <= the format's maximum, so the two give the
// same bits (the GPU test compares them exactly); under delayed scaling the scale comes from
// earlier steps and a larger tensor saturates (the shim's libtorch path clamps to match).

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "device_types.h"
#include "fused_host.h"
#include "jit.h"

namespace bench_fused {
namespace {

// ELEM (Bf16 or F32) and CVT (the PTX conversion of two fp32 values) are prepended.
const char* kSource = R"CUDA(
typedef ELEM T;
typedef T::E E;
typedef T::Vec Vec;

__device__ __forceinline__ unsigned short to_fp8x2(float lo, float hi) {
  unsigned short r;
  asm("{ .reg .b16 t; " CVT " t, %1, %2; mov.b16 %0, t; }" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The T::N values of one 16-byte vector times s, as fp8 bytes in order, four to a word;
// m becomes the largest of m and the values' magnitudes (fmaxf drops a NaN, so a NaN is
// carried by the flag nan instead: it must reach the amax, as it reaches libtorch's norm).
__device__ __forceinline__ void quantize_vec(const Vec& x, float s, u32* w, float& m,
                                             bool& nan) {
  float f[T::N];
  T::unpack(x, f);
#pragma unroll
  for (int k = 0; k < T::N; ++k) {
    m = fmaxf(m, fabsf(f[k]));
    nan |= f[k] != f[k];
  }
#pragma unroll
  for (int k = 0; k < T::N / 4; ++k) {
    const u32 lo = to_fp8x2(f[4 * k] * s, f[4 * k + 1] * s);
    const u32 hi = to_fp8x2(f[4 * k + 2] * s, f[4 * k + 3] * s);
    w[k] = lo | (hi << 16);
  }
}

// Stores the T::N fp8 bytes of quantize_vec at dst (aligned to their size).
__device__ __forceinline__ void store_fp8(unsigned char* dst, const u32* w) {
  if (T::N == 8) {
    *(uint2*)dst = make_uint2(w[0], w[T::N / 4 - 1]);
  } else {
    *(u32*)dst = w[0];
  }
}

// Folds the block's magnitudes into *amax (when amax is not null): a warp's maximum by
// shuffles, the block's through shared memory, one atomic per block. A float that is not
// negative orders like its bits as a signed integer, so atomicMax on the bits is a float
// maximum; a NaN is stored as the quiet NaN 0x7fffffff, above every other such bit pattern.
// Every thread of the block must call it (it synchronizes).
__device__ __forceinline__ void fold_amax(float m, bool nan, float* amax) {
  __shared__ int block_max[8];
  int bits = nan ? 0x7fffffff : __float_as_int(m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0) block_max[threadIdx.x >> 5] = bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    int b = block_max[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); ++k) b = max(b, block_max[k]);
    atomicMax((int*)amax, b);
  }
}

// q = fp8(x * scale[0]) over nvec 16-byte vectors of x; *amax takes the largest magnitude
// of x when amax is not null (delayed scaling records it for the next steps' scales).
extern "C" __global__ void __launch_bounds__(256)
quant_fp8(const E* __restrict__ x, const float* __restrict__ scale, unsigned char* __restrict__ q,
          u64 nvec, float* __restrict__ amax) {
  const float s = *scale;
  const Vec* xv = (const Vec*)x;
  float m = 0.0f;
  bool nan = false;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < nvec;
       i += (u64)gridDim.x * blockDim.x) {
    u32 w[T::N / 4];
    quantize_vec(xv[i], s, w, m, nan);
    store_fp8(q + i * T::N, w);
  }
  if (amax != 0) fold_amax(m, nan, amax);
}

// The same quantization of x [rows, cols] by 64 x 64 tiles, also writing the transpose qt
// [cols, rows] row-major (and q itself unless it is null): what the fp8 linear's backward
// needs as its column-major operands, which libtorch's strided copy (`q.t().contiguous()`)
// otherwise writes in a pass of its own. A block reads its tile in 16-byte vectors, writes
// q's rows as they come, keeps the fp8 bytes in shared memory and writes qt's rows four
// bytes a thread. rows and cols are multiples of 64 (quantize_fp8_t_supported).
extern "C" __global__ void __launch_bounds__(256)
quant_fp8_t(const E* __restrict__ x, const float* __restrict__ scale, unsigned char* __restrict__ q,
            unsigned char* __restrict__ qt, u64 rows, u64 cols, float* __restrict__ amax) {
  // 64 rows of 64 bytes (16 words), one word of padding to spread the column reads over banks.
  __shared__ u32 tile[64][17];
  const float s = *scale;
  const u64 r0 = (u64)blockIdx.y * 64, c0 = (u64)blockIdx.x * 64;
  const int vpr = 64 / T::N;  // vectors per tile row
  float m = 0.0f;
  bool nan = false;
  for (int i = threadIdx.x; i < 64 * vpr; i += blockDim.x) {
    const int r = i / vpr, v = i % vpr;
    const u64 at = (r0 + r) * cols + c0 + (u64)v * T::N;
    u32 w[T::N / 4];
    quantize_vec(*(const Vec*)(x + at), s, w, m, nan);
#pragma unroll
    for (int k = 0; k < T::N / 4; ++k) tile[r][v * (T::N / 4) + k] = w[k];
    if (q != 0) store_fp8(q + at, w);
  }
  __syncthreads();
  const unsigned char* tb = (const unsigned char*)&tile[0][0];
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
    // qt's row c0 + c, bytes r0 + 4j .. r0 + 4j + 3: the tile's column c, rows 4j .. 4j + 3.
    const int c = i / 16, j = i % 16;
    u32 word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) word |= (u32)tb[(4 * j + b) * (17 * 4) + c] << (8 * b);
    *(u32*)(qt + (c0 + c) * rows + r0 + 4 * j) = word;
  }
  if (amax != 0) fold_amax(m, nan, amax);
}
)CUDA";

const std::vector<cudaKernel_t>& quant_kernels(at::ScalarType t, at::ScalarType fp8,
                                               int device) {
  const bool bf16 = t == at::kBFloat16;
  const bool e4m3 = fp8 == at::kFloat8_e4m3fn;
  static const std::vector<std::string> names = {"quant_fp8", "quant_fp8_t"};
  return bench_jit::kernels(std::string("quant_fp8_") + (bf16 ? "bf16" : "f32") +
                                (e4m3 ? "_e4m3" : "_e5m2"),
                            quantize_fp8_source(t, fp8), names, device);
}

// The arguments both quantizations share: the format and a one-element fp32 scale beside t.
void check_format_and_scale(const at::Tensor& t, const at::Tensor& scale, at::ScalarType fp8) {
  TORCH_CHECK(fp8 == at::kFloat8_e4m3fn || fp8 == at::kFloat8_e5m2,
              "fp8 quantization: the format must be e4m3fn or e5m2");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == 1 &&
                  scale.device() == t.device(),
              "fp8 quantization: the scale must be one fp32 number on the tensor's device");
}

}  // namespace

bool quantize_fp8_supported(const at::Tensor& t) {
  if (!t.is_cuda() || !t.is_contiguous()) return false;
  if (t.scalar_type() != at::kBFloat16 && t.scalar_type() != at::kFloat) return false;
  return t.numel() % vec_width(t.scalar_type()) == 0 &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The amax slot's address: null without one, else one fp32 number on t's device.
static float* amax_slot(const at::Tensor& t, const at::Tensor* amax) {
  if (amax == nullptr || !amax->defined()) return nullptr;
  TORCH_CHECK(amax->scalar_type() == at::kFloat && amax->numel() == 1 &&
                  amax->device() == t.device(),
              "fp8 quantization: the amax slot must be one fp32 number on the tensor's device");
  return amax->data_ptr<float>();
}

at::Tensor quantize_fp8(const at::Tensor& t, const at::Tensor& scale, at::ScalarType fp8,
                        const at::Tensor* amax) {
  TORCH_CHECK(quantize_fp8_supported(t), "fp8 quantization: the tensor must be contiguous, ",
              "16-byte aligned bf16 or fp32 on a GPU, a whole number of vectors long");
  check_format_and_scale(t, scale, fp8);
  c10::cuda::CUDAGuard guard(t.device());
  auto q = at::empty(t.sizes(), t.options().dtype(fp8));
  const uint64_t nvec = static_cast<uint64_t>(t.numel() / vec_width(t.scalar_type()));
  if (nvec == 0) return q;
  auto s = scale.contiguous();
  const auto& ks = quant_kernels(t.scalar_type(), fp8, t.get_device());
  const void* xp = t.data_ptr();
  const void* sp = s.data_ptr();
  void* qp = q.data_ptr();
  unsigned long long n = nvec;
  float* ap = amax_slot(t, amax);
  void* args[] = {&xp, &sp, &qp, &n, &ap};
  bench_jit::launch(ks[0], dim3(grid_for(nvec, t.get_device())), dim3(256), args, 0,
                    at::cuda::getCurrentCUDAStream(t.get_device()).stream());
  return q;
}

bool quantize_fp8_t_supported(const at::Tensor& t) {
  // The grid's y dimension counts 64-row tiles and stops at 65535.
  return quantize_fp8_supported(t) && t.dim() == 2 && t.size(0) % 64 == 0 &&
         t.size(1) % 64 == 0 && t.size(0) / 64 <= 65535;
}

std::pair<at::Tensor, at::Tensor> quantize_fp8_t(const at::Tensor& t, const at::Tensor& scale,
                                                 at::ScalarType fp8, bool want_q,
                                                 const at::Tensor* amax) {
  TORCH_CHECK(quantize_fp8_t_supported(t), "fp8 transposing quantization: the tensor must be ",
              "a contiguous, 16-byte aligned bf16 or fp32 matrix on a GPU, both sides multiples ",
              "of 64");
  check_format_and_scale(t, scale, fp8);
  c10::cuda::CUDAGuard guard(t.device());
  const int64_t rows = t.size(0), cols = t.size(1);
  at::Tensor q = want_q ? at::empty({rows, cols}, t.options().dtype(fp8)) : at::Tensor();
  auto qt = at::empty({cols, rows}, t.options().dtype(fp8));
  if (rows == 0 || cols == 0) return {q, qt};
  auto s = scale.contiguous();
  const auto& ks = quant_kernels(t.scalar_type(), fp8, t.get_device());
  const void* xp = t.data_ptr();
  const void* sp = s.data_ptr();
  void* qp = want_q ? q.data_ptr() : nullptr;
  void* qtp = qt.data_ptr();
  unsigned long long r = rows, c = cols;
  float* ap = amax_slot(t, amax);
  void* args[] = {&xp, &sp, &qp, &qtp, &r, &c, &ap};
  bench_jit::launch(ks[1], dim3(static_cast<unsigned>(cols / 64), static_cast<unsigned>(rows / 64)),
                    dim3(256), args, 0, at::cuda::getCurrentCUDAStream(t.get_device()).stream());
  return {q, qt};
}

std::string quantize_fp8_source(at::ScalarType t, at::ScalarType fp8) {
  const char* cvt = fp8 == at::kFloat8_e4m3fn ? "cvt.rn.satfinite.e4m3x2.f32"
                                               : "cvt.rn.satfinite.e5m2x2.f32";
  return std::string("#define ELEM ") + (t == at::kBFloat16 ? "Bf16" : "F32") +
         "\n#define CVT \"" + cvt + "\"\n" + device_types_source() + kSource;
}

}  // namespace bench_fused
