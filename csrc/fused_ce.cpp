// Fused cross-entropy for the output head (what llm.c calls its fused classifier).
//
// The unfused path casts the [N, V] bf16 logits to fp32, runs log_softmax and nll_loss, and
// its backward runs nll_loss_backward, log_softmax_backward and the cast back: about ten
// passes over an [N, V] tensor, most of them in fp32 (some 30 GB per gpt2-125m step at
// 16x1024 tokens and V = 50304). Here the forward reads the logits once (online softmax: a
// running maximum and a rescaled running sum per thread, merged across the block) and keeps
// only the per-row log-sum-exp (N floats); the backward reads the logits once more and writes
// dlogits = (softmax - onehot) * grad / count in the logits' dtype, optionally into the
// logits' own buffer. Three passes over bf16 data in all, fp32 arithmetic throughout.

#include "fused.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include "device_types.h"
#include "jit.h"

namespace bench_fused {
namespace {

// One block per row. Rows are split at 16-byte boundaries: a scalar head up to the first
// boundary, 16-byte vectors (8 bf16 or 4 fp32), a scalar tail; so any V works (50257 too)
// and the vector loads are always aligned. dlogits rows have the same alignment as the
// logits' rows (the host checks that both bases are 16-byte aligned).
const char* kSource = R"CUDA(
// Elements before the row's first 16-byte boundary, and the number of whole vectors after.
template <class T>
__device__ __forceinline__ void split(const typename T::E* p, int V, int& head, int& nv) {
  int mis = (int)(((u64)p & 15) / sizeof(typename T::E));
  head = mis ? T::N - mis : 0;
  if (head > V) head = V;
  nv = (V - head) / T::N;
}

// Online softmax state: m is the running maximum, s the sum of exp(x - m) so far.
__device__ __forceinline__ void merge(float& m, float& s, float mo, float so) {
  float nm = fmaxf(m, mo);
  if (nm == neg_inf()) return;  // both still empty
  s = s * exp2f((m - nm) * LOG2E) + so * exp2f((mo - nm) * LOG2E);
  m = nm;
}

__device__ __forceinline__ void add1(float& m, float& s, float x) {
  float nm = fmaxf(m, x);
  if (nm == neg_inf()) return;
  s = s * exp2f((m - nm) * LOG2E) + exp2f((x - nm) * LOG2E);
  m = nm;
}

template <class T>
__device__ __forceinline__ void addv(float& m, float& s, const typename T::Vec& v) {
  float f[T::N];
  T::unpack(v, f);
  float vm = f[0];
#pragma unroll
  for (int k = 1; k < T::N; ++k) vm = fmaxf(vm, f[k]);
  float nm = fmaxf(m, vm);
  if (nm == neg_inf()) return;
  float nmL = nm * LOG2E;
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < T::N; ++k) acc += exp2f(fmaf(f[k], LOG2E, -nmL));
  s = s * exp2f((m - nm) * LOG2E) + acc;
  m = nm;
}

// Merges every thread's (m, s) into all threads' (m, s). blockDim.x is a multiple of 32.
__device__ __forceinline__ void block_merge(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __shared__ float sm[32], ss[32];
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) { sm[w] = m; ss[w] = s; }
  __syncthreads();
  if (w == 0) {
    m = l < nw ? sm[l] : neg_inf();
    s = l < nw ? ss[l] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (l == 0) { sm[0] = m; ss[0] = s; }
  }
  __syncthreads();
  m = sm[0];
  s = ss[0];
}

// Per row: lse[row] = log(sum(exp(x))), loss[row] = lse - x[target] (0 where the target is
// ignore_index, NaN where it is out of range, so that a bad target cannot pass unnoticed).
template <class T>
__device__ __forceinline__ void ce_fwd(const typename T::E* __restrict__ x,
                                       const i64* __restrict__ tgt, float* __restrict__ lse,
                                       float* __restrict__ loss, int V, i64 ignore) {
  typedef typename T::E E;
  typedef typename T::Vec Vec;
  const int row = blockIdx.x, bd = blockDim.x;
  const E* p = x + (u64)row * (u64)V;
  int head, nv;
  split<T>(p, V, head, nv);
  const int tail = head + nv * T::N;
  float m = neg_inf(), s = 0.f;
  for (int j = threadIdx.x; j < head; j += bd) add1(m, s, T::get(p[j]));
  for (int j = tail + threadIdx.x; j < V; j += bd) add1(m, s, T::get(p[j]));
  const Vec* pv = (const Vec*)(p + head);
  int i = threadIdx.x;
  // Four independent 16-byte loads in flight per thread before their first use.
  for (; i + 3 * bd < nv; i += 4 * bd) {
    Vec a = pv[i], b = pv[i + bd], c = pv[i + 2 * bd], d = pv[i + 3 * bd];
    addv<T>(m, s, a);
    addv<T>(m, s, b);
    addv<T>(m, s, c);
    addv<T>(m, s, d);
  }
  for (; i < nv; i += bd) addv<T>(m, s, pv[i]);
  block_merge(m, s);
  if (threadIdx.x == 0) {
    float l = m + __logf(s);
    lse[row] = l;
    i64 t = tgt[row];
    float r;
    if (t == ignore) r = 0.f;
    else if (t < 0 || t >= V) r = __int_as_float(0x7fc00000);
    else r = l - T::get(p[t]);
    loss[row] = r;
  }
}

// Per row: dx = (exp(x - lse) - onehot(target)) * scale[0], zero where the target is
// ignore_index. x and dx may be the same buffer: each element is read, then written, by the
// same thread.
template <class T>
__device__ __forceinline__ void ce_bwd(const typename T::E* x, const i64* __restrict__ tgt,
                                       const float* __restrict__ lse,
                                       const float* __restrict__ scale_p, typename T::E* dx,
                                       int V, i64 ignore) {
  typedef typename T::E E;
  typedef typename T::Vec Vec;
  const int row = blockIdx.x, bd = blockDim.x;
  const E* p = x + (u64)row * (u64)V;
  E* q = dx + (u64)row * (u64)V;
  int head, nv;
  split<T>(p, V, head, nv);
  const int tail = head + nv * T::N;
  const Vec* pv = (const Vec*)(p + head);
  Vec* qv = (Vec*)(q + head);
  const i64 t64 = tgt[row];
  if (t64 == ignore) {
    for (int j = threadIdx.x; j < head; j += bd) q[j] = T::put(0.f);
    for (int j = tail + threadIdx.x; j < V; j += bd) q[j] = T::put(0.f);
    float z[T::N];
#pragma unroll
    for (int k = 0; k < T::N; ++k) z[k] = 0.f;
    Vec zv = T::pack(z);
    for (int i = threadIdx.x; i < nv; i += bd) qv[i] = zv;
    return;
  }
  // An out-of-range target matches no column (its loss is already NaN).
  const int t = (t64 >= 0 && t64 < V) ? (int)t64 : -1;
  const float scale = *scale_p;
  const float lL = lse[row] * LOG2E;
  for (int j = threadIdx.x; j < head; j += bd)
    q[j] = T::put((exp2f(fmaf(T::get(p[j]), LOG2E, -lL)) - (j == t ? 1.f : 0.f)) * scale);
  for (int j = tail + threadIdx.x; j < V; j += bd)
    q[j] = T::put((exp2f(fmaf(T::get(p[j]), LOG2E, -lL)) - (j == t ? 1.f : 0.f)) * scale);
  int i = threadIdx.x;
  for (; i + 3 * bd < nv; i += 4 * bd) {
    Vec v[4] = {pv[i], pv[i + bd], pv[i + 2 * bd], pv[i + 3 * bd]};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float f[T::N];
      T::unpack(v[u], f);
      const int j0 = head + (i + u * bd) * T::N;
#pragma unroll
      for (int k = 0; k < T::N; ++k)
        f[k] = (exp2f(fmaf(f[k], LOG2E, -lL)) - (j0 + k == t ? 1.f : 0.f)) * scale;
      qv[i + u * bd] = T::pack(f);
    }
  }
  for (; i < nv; i += bd) {
    float f[T::N];
    T::unpack(pv[i], f);
    const int j0 = head + i * T::N;
#pragma unroll
    for (int k = 0; k < T::N; ++k)
      f[k] = (exp2f(fmaf(f[k], LOG2E, -lL)) - (j0 + k == t ? 1.f : 0.f)) * scale;
    qv[i] = T::pack(f);
  }
}

extern "C" __global__ void __launch_bounds__(1024)
ce_fwd_bf16(const u16* __restrict__ x, const i64* __restrict__ t, float* __restrict__ lse,
            float* __restrict__ loss, int V, i64 ignore) {
  ce_fwd<Bf16>(x, t, lse, loss, V, ignore);
}
extern "C" __global__ void __launch_bounds__(1024)
ce_fwd_f32(const float* __restrict__ x, const i64* __restrict__ t, float* __restrict__ lse,
           float* __restrict__ loss, int V, i64 ignore) {
  ce_fwd<F32>(x, t, lse, loss, V, ignore);
}
extern "C" __global__ void __launch_bounds__(1024)
ce_bwd_bf16(const u16* x, const i64* __restrict__ t, const float* __restrict__ lse,
            const float* __restrict__ scale, u16* dx, int V, i64 ignore) {
  ce_bwd<Bf16>(x, t, lse, scale, dx, V, ignore);
}
extern "C" __global__ void __launch_bounds__(1024)
ce_bwd_f32(const float* x, const i64* __restrict__ t, const float* __restrict__ lse,
           const float* __restrict__ scale, float* dx, int V, i64 ignore) {
  ce_bwd<F32>(x, t, lse, scale, dx, V, ignore);
}
)CUDA";

enum Kernel { kFwdBf16, kFwdF32, kBwdBf16, kBwdF32 };

const std::vector<cudaKernel_t>& ce_kernels(int device) {
  static const std::vector<std::string> names = {"ce_fwd_bf16", "ce_fwd_f32", "ce_bwd_bf16",
                                                 "ce_bwd_f32"};
  return bench_jit::kernels("fused_cross_entropy", cross_entropy_source(), names, device);
}

// Threads per block when the caller asks for none. One block per row, so a block of 1024
// threads covers a GPT-2 row (50304 bf16, 6288 vectors) in about six 16-byte loads per
// thread; smaller rows get fewer threads (a warp at least).
constexpr int64_t kDefaultThreads = 1024;

int64_t pick_threads(int64_t V, int64_t vec, int64_t requested) {
  if (requested > 0) {
    TORCH_CHECK(requested % 32 == 0 && requested <= 1024,
                "fused cross-entropy: threads per block must be a multiple of 32, at most 1024");
    return requested;
  }
  int64_t need = (V / vec + 31) / 32 * 32;
  return std::max<int64_t>(32, std::min(kDefaultThreads, need));
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

struct FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t ignore_index, bool reuse,
                            int64_t threads) {
    TORCH_CHECK(logits.is_cuda(), "fused cross-entropy: logits must be on a CUDA device");
    TORCH_CHECK(logits.dim() == 2, "fused cross-entropy: logits must be [N, V]");
    TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat,
                "fused cross-entropy: logits must be bf16 or fp32, not ",
                logits.scalar_type());
    TORCH_CHECK(targets.scalar_type() == at::kLong && targets.dim() == 1 &&
                    targets.size(0) == logits.size(0) && targets.device() == logits.device(),
                "fused cross-entropy: targets must be int64 [N] on the logits' device");
    const int64_t n = logits.size(0), v = logits.size(1);
    TORCH_CHECK(v > 0 && v < (int64_t(1) << 31) && n < (int64_t(1) << 31),
                "fused cross-entropy: [", n, ", ", v, "] is out of range");
    c10::cuda::CUDAGuard guard(logits.device());
    auto x = logits.contiguous();
    // The backward writes dlogits with the same row alignment as x: both bases 16-byte aligned
    // (fresh allocations are; only a view with an odd offset is not).
    if (!aligned16(x)) x = x.clone();
    auto t = targets.contiguous();
    auto opts = x.options().dtype(at::kFloat);
    auto lse = at::empty({n}, opts);
    auto rows = at::empty({n}, opts);
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    const int64_t block = pick_threads(v, bf16 ? 8 : 4, threads);
    if (n > 0) {
      const auto& ks = ce_kernels(x.get_device());
      const void* xp = x.data_ptr();
      const void* tp = t.data_ptr();
      void* lp = lse.data_ptr();
      void* rp = rows.data_ptr();
      int vi = static_cast<int>(v);
      long long ig = ignore_index;
      void* args[] = {&xp, &tp, &lp, &rp, &vi, &ig};
      bench_jit::launch(ks[bf16 ? kFwdBf16 : kFwdF32], dim3(static_cast<unsigned>(n)),
                        dim3(static_cast<unsigned>(block)), args, 0,
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    }
    // Mean over the rows that count, as nll_loss's mean reduction: 0/0 = NaN when none does.
    auto count = t.ne(ignore_index).sum(at::kFloat);
    auto loss = rows.sum() / count;
    ctx->save_for_backward({x, t, lse, count});
    ctx->saved_data["ignore"] = ignore_index;
    // Reusing a private copy (made above) is always safe; reusing the caller's tensor only
    // when the caller said so.
    ctx->saved_data["reuse"] = reuse || !x.is_same(logits);
    ctx->saved_data["block"] = block;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto& x = saved[0];
    auto& t = saved[1];
    auto& lse = saved[2];
    auto& count = saved[3];
    const int64_t ignore_index = ctx->saved_data["ignore"].toInt();
    const bool reuse = ctx->saved_data["reuse"].toBool();
    const int64_t block = ctx->saved_data["block"].toInt();
    c10::cuda::CUDAGuard guard(x.device());
    // grad / count stays on the device (no host sync, so the backward can be captured).
    auto scale = (grads[0].to(at::kFloat) / count).contiguous();
    auto dx = reuse ? x : at::empty_like(x);
    const int64_t n = x.size(0), v = x.size(1);
    if (n > 0) {
      const bool bf16 = x.scalar_type() == at::kBFloat16;
      const auto& ks = ce_kernels(x.get_device());
      const void* xp = x.data_ptr();
      const void* tp = t.data_ptr();
      const void* lp = lse.data_ptr();
      const void* sp = scale.data_ptr();
      void* dp = dx.data_ptr();
      int vi = static_cast<int>(v);
      long long ig = ignore_index;
      void* args[] = {&xp, &tp, &lp, &sp, &dp, &vi, &ig};
      bench_jit::launch(ks[bf16 ? kBwdBf16 : kBwdF32], dim3(static_cast<unsigned>(n)),
                        dim3(static_cast<unsigned>(block)), args, 0,
                        at::cuda::getCurrentCUDAStream(x.get_device()).stream());
    }
    // The logits now hold their gradient: any later unpacking of them (a second backward
    // through a retained graph, another op that saved them) fails the version check
    // instead of reading gradients as logits.
    if (reuse) torch::autograd::impl::bump_version(x);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

const std::string& cross_entropy_source() {
  static const std::string s = std::string(device_types_source()) + kSource;
  return s;
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index, bool reuse_logits, int64_t threads) {
  return FusedCrossEntropy::apply(logits, targets, ignore_index, reuse_logits, threads);
}

}  // namespace bench_fused
