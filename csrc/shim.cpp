// C++ shim for what libtorch offers only in C++: custom autograd Functions (fp8 linear
// through at::_scaled_mm; the fused cross-entropy of fused_ce.cpp, whose kernels are our own
// CUDA compiled at run time, see jit.h), the fused AdamW kernel, CUDA-graph capture and
// replay, and the CUDA caching allocator's statistics. Tensors cross the boundary as `at::Tensor*`, which is
// what tch's C_tensor points to. Every function catches C++ exceptions and reports them
// through bench_last_error() so that no exception unwinds into Rust.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fused.h"
#include "jit.h"

namespace {

thread_local std::string g_last_error;

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown C++ exception";
  }
  return 1;
}

// The largest finite values of the two fp8 formats.
constexpr double kE4M3Max = 448.0;
constexpr double kE5M2Max = 57344.0;

// Dynamic per-tensor scaling: the tensor's absolute maximum maps to the format's maximum.
// Returns the fp8 tensor and the inverse scale that _scaled_mm multiplies back in. The
// maximum is one reduction kernel (an infinity norm, no |t| temporary). The scale is a
// power of two: multiplying by it is exact, so |t * scale| <= amax * scale <= fmax and no
// clamp pass is needed (fp8 casts do not saturate), and its inverse is exact too. A
// floating-point format's relative precision does not depend on the scale, so this costs
// at most one binade of headroom.
//
// The scale-and-cast runs in one pass of our own kernel (csrc/fused_fp8.cpp) unless
// BENCH_FUSED_FP8=0 asks for libtorch's product and cast (to compare the two).
bool fused_fp8_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BENCH_FUSED_FP8");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// t's largest magnitude, in fp32 (one reduction kernel; a NaN propagates).
at::Tensor abs_max(const at::Tensor& t) {
  return at::linalg_vector_norm(t, INFINITY, std::nullopt, false, at::kFloat);
}

// The power-of-two scale that maps amax (elementwise) to the format's maximum fmax or just
// below it. Dynamic scaling takes it for the tensor's own amax, delayed scaling's roll for
// the history's, so one step of history gives exactly dynamic's scale.
at::Tensor pow2_scale(const at::Tensor& amax, double fmax) {
  return at::exp2(at::floor(at::log2(fmax / amax.clamp_min(1e-30))));
}

at::Tensor fp8_scale(const at::Tensor& t, double fmax) { return pow2_scale(abs_max(t), fmax); }

// Raises the one-element *amax to t's largest magnitude, where no fused kernel did.
void record_amax(const at::Tensor& t, const at::Tensor& amax) {
  // at::maximum propagates a NaN, as the fused kernel does.
  amax.copy_(at::maximum(amax, abs_max(t).reshape({1})));
}

// fp8(t * scale); with an amax slot (defined), also raises it to t's largest magnitude (the
// fused kernel in the same pass). The fused kernel's conversion saturates at the format's
// maximum; libtorch's cast does not (e4m3fn has no infinity: a NaN; e5m2 an infinity), so
// where the scale may be smaller than t needs (`saturate`: delayed scaling, whose scale
// comes from earlier steps' maxima) the product is clamped first, as the kernel would.
at::Tensor scale_and_cast(const at::Tensor& t, const at::Tensor& scale, at::ScalarType fp8,
                          const at::Tensor& amax = at::Tensor(), double saturate = 0.0) {
  if (fused_fp8_enabled() && bench_fused::quantize_fp8_supported(t)) {
    return bench_fused::quantize_fp8(t, scale, fp8, &amax);
  }
  if (amax.defined()) record_amax(t, amax);
  auto scaled = t * scale.to(t.scalar_type());
  if (saturate > 0.0) scaled = scaled.clamp(-saturate, saturate);
  return scaled.to(fp8);
}

std::pair<at::Tensor, at::Tensor> quantize(const at::Tensor& t, at::ScalarType fp8, double fmax) {
  auto scale = fp8_scale(t, fmax);
  return {scale_and_cast(t, scale, fp8), scale.reciprocal()};
}

// The backward's matmuls take the fp8 copies transposed (column-major operands). The
// transposing kernel (csrc/fused_fp8.cpp) writes that copy from the quantization pass itself,
// where libtorch's strided copy `q.t().contiguous()` took a pass of its own: 24 ms of the
// Llama proxy's 142 ms fp8 step, profiled. BENCH_FUSED_FP8T=0 keeps the separate copy.
bool fused_fp8_transpose_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BENCH_FUSED_FP8T");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// {q, qt, inv_scale}: the quantization of the matrix t, its transpose qt (row-major, so
// qt.t() is q's column-major copy) and the inverse scale; q only when want_q.
struct Quantized {
  at::Tensor q, qt, inv_scale;
};

// Delayed (amax-history) scaling, as Transformer Engine's and torchao's delayed recipes do
// it: a tensor is scaled by what earlier steps' absolute maxima say, and its own maximum
// is recorded by the quantization pass itself for the steps after, so the separate
// absolute-maximum pass of dynamic scaling (one reduction kernel before each quantization,
// 3.6 ms of the Llama proxy's fp8 step in the 2026-11-23 profile) goes away.
//
// The state of one fp8 linear is a row per operand (0: x, 1: w, 2: the incoming gradient)
// of kScalingCols fp32 numbers: [scale, 1 / scale, this step's amax, the amax of the
// kAmaxHistory - 1 steps before]. fp8_roll, once per optimizer step, turns the rows over for
// every linear at once. Until the first roll (primed false) there is no history: the
// tensor is scaled dynamically and its amax recorded all the same. A tensor larger than
// its history allowed for saturates at the format's maximum, as in those recipes. Each
// data-parallel rank keeps its own history (the weights' maxima agree across ranks; x's
// and the gradients' may not), where Transformer Engine reduces the maxima over the group.

constexpr int64_t kAmaxHistory = 16;
constexpr int64_t kScalingCols = 2 + kAmaxHistory;

struct Scaling {
  at::Tensor row;  // one operand's row [kScalingCols], or undefined for dynamic scaling
  bool primed;
};

// What the entry points take as a scaling state: fp32 of `shape` on t's device.
void check_scaling_state(const at::Tensor& st, at::IntArrayRef shape, const at::Tensor& t,
                         const char* what) {
  TORCH_CHECK(st.sizes() == shape && st.scalar_type() == at::kFloat && st.device() == t.device(),
              what, ": the scaling state must be fp32 ", shape, " on the tensor's device, not ",
              st.scalar_type(), " ", st.sizes(), " on ", st.device());
}

Quantized quantize_t(const at::Tensor& t, at::ScalarType fp8, double fmax, bool want_q,
                     const Scaling& sc = {at::Tensor(), false}) {
  at::Tensor scale, inv, amax;
  if (sc.row.defined()) amax = sc.row.narrow(0, 2, 1);
  if (sc.row.defined() && sc.primed) {
    scale = sc.row.narrow(0, 0, 1);
    // A tensor of its own, as dynamic scaling's inverse is: on an H100 cuBLASLt refused
    // (CUBLAS_STATUS_NOT_SUPPORTED) the view into the row as _scaled_mm's scale.
    inv = sc.row.narrow(0, 1, 1).clone();
  } else {
    scale = fp8_scale(t, fmax);
    inv = scale.reciprocal();
  }
  if (fused_fp8_enabled() && fused_fp8_transpose_enabled() &&
      bench_fused::quantize_fp8_t_supported(t)) {
    auto [q, qt] = bench_fused::quantize_fp8_t(t, scale, fp8, want_q, &amax);
    return {q, qt, inv};
  }
  auto q = scale_and_cast(t, scale, fp8, amax, sc.row.defined() && sc.primed ? fmax : 0.0);
  return {q, q.t().contiguous(), inv};
}

// Turns every linear's scaling rows over at the end of an optimizer step: the new scale
// comes from the largest amax of the last kAmaxHistory steps (this one's included), as a
// power of two like dynamic scaling's; the history moves one slot on and this step's slot
// is cleared for the next step's quantizations to raise. st is [sites, 3, kScalingCols].
void fp8_roll(const at::Tensor& st) {
  TORCH_CHECK(st.dim() == 3 && st.size(1) == 3 && st.size(2) == kScalingCols &&
                  st.scalar_type() == at::kFloat && st.is_contiguous(),
              "fp8 scaling state: expected a contiguous fp32 [sites, 3, ", kScalingCols, "]");
  auto hist = st.narrow(2, 2, kAmaxHistory);
  // at::amax propagates a NaN, as dynamic scaling's norm does.
  auto amax = hist.amax({2});
  hist.narrow(2, 1, kAmaxHistory - 1).copy_(hist.narrow(2, 0, kAmaxHistory - 1).clone());
  hist.select(2, 0).zero_();
  // Each operand's format maximum as a scalar: a tensor of them would be copied from the
  // host, which a CUDA graph capture does not allow.
  const double fmax[3] = {kE4M3Max, kE4M3Max, kE5M2Max};
  for (int64_t k = 0; k < 3; ++k) {
    auto scale = pow2_scale(amax.select(1, k), fmax[k]);
    st.select(1, k).select(1, 0).copy_(scale);
    st.select(1, k).select(1, 1).copy_(scale.reciprocal());
  }
}

// y = x @ w^T with x [M, K] in bf16 and w [N, K] in its own dtype (an fp32 master or a bf16
// working copy): the weight is quantized straight from it, skipping a cast, and its gradient
// comes out in that dtype. Matmuls in fp8 (e4m3 forward, e5m2 for the incoming gradient). Saves the
// fp8 copies, which also halves the memory the backward keeps.
//
// st, when not null, is the linear's delayed-scaling state [3, kScalingCols] (see
// quantize_t); primed says whether a roll has filled its scales yet. st goes in as a
// pointer, not a tensor: autograd takes every tensor argument of apply for an input
// (an undefined one fails with "tensor does not have a device", as seen on an H100).
struct Fp8Linear : public torch::autograd::Function<Fp8Linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor* st, bool primed) {
    auto row = [&](int64_t k) -> Scaling {
      return {st != nullptr ? st->select(0, k) : at::Tensor(), primed};
    };
    // The backward needs x8 and w8 only transposed, so those copies are what is saved; x8
    // and w8 themselves are freed after the forward's matmul.
    auto xq = quantize_t(x, at::kFloat8_e4m3fn, kE4M3Max, true, row(0));
    auto wq = quantize_t(w, at::kFloat8_e4m3fn, kE4M3Max, true, row(1));
    // _scaled_mm wants its first operand row-major and its second column-major; w8.t() is
    // the column-major view of the row-major w8.
    // Fast accumulation in the forward matmul only, as Transformer Engine does; the gradient
    // matmuls below accumulate in full precision.
    auto y = at::_scaled_mm(xq.q, wq.q.t(), xq.inv_scale, wq.inv_scale, std::nullopt,
                            std::nullopt, x.scalar_type(), true);
    ctx->save_for_backward({xq.qt, wq.qt, xq.inv_scale, wq.inv_scale});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    // The state is not saved for backward (autograd would check its version, which the
    // step's roll changes after the backward); the gradient's row is written in place.
    if (st != nullptr) ctx->saved_data["st"] = *st;
    ctx->saved_data["primed"] = primed;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto& x8t = saved[0];  // [K, M]
    auto& w8t = saved[1];  // [K, N]
    auto& sx = saved[2];
    auto& sw = saved[3];
    auto g = grads[0].contiguous();
    auto found = ctx->saved_data.find("st");
    Scaling grow{found != ctx->saved_data.end() ? found->second.toTensor().select(0, 2)
                                                : at::Tensor(),
                 ctx->saved_data["primed"].toBool()};
    auto gq = quantize_t(g, at::kFloat8_e5m2, kE5M2Max, true, grow);
    auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    // dx [M, K] = g [M, N] @ w [N, K]: w column-major, which w8t.t() is.
    auto dx = at::_scaled_mm(gq.q, w8t.t(), gq.inv_scale, sw, std::nullopt, std::nullopt,
                             x_dtype, false);
    // dw [N, K] = g^T [N, M] @ x [M, K]: g^T row-major (gq.qt), x column-major (x8t.t()).
    auto dw = at::_scaled_mm(gq.qt, x8t.t(), gq.inv_scale, sx, std::nullopt, std::nullopt,
                             w_dtype, false);
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

struct GraphState {
  at::cuda::CUDAGraph graph;
  std::optional<c10::cuda::CUDAStream> stream;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

}  // namespace

extern "C" {

const char* bench_last_error() { return g_last_error.c_str(); }

// fp8 linear: *out = Fp8Linear(x2d, w); x2d is [M, K] bf16, w is [N, K] bf16. st is null
// for dynamic scaling, else the linear's delayed-scaling state [3, kScalingCols] (primed
// once a roll has filled its scales).
int bench_fp8_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* st, int primed,
                     at::Tensor** out) {
  return guarded([&] {
    if (st != nullptr) check_scaling_state(*st, {3, kScalingCols}, *x, "fp8 linear");
    *out = new at::Tensor(Fp8Linear::apply(*x, *w, st, primed != 0));
  });
}

// The number of fp32 columns of one operand's delayed-scaling row.
int64_t bench_fp8_scaling_cols() { return kScalingCols; }

// Turns the delayed-scaling state [sites, 3, kScalingCols] over after an optimizer step.
int bench_fp8_roll(const at::Tensor* st) {
  return guarded([&] { fp8_roll(*st); });
}

// Fused cross-entropy: *out = mean loss (fp32 scalar) of logits [N, V] (bf16 or fp32, CUDA)
// against int64 targets [N]; see fused.h for reuse_logits and threads.
int bench_fused_cross_entropy(const at::Tensor* logits, const at::Tensor* targets,
                              int64_t ignore_index, int reuse_logits, int64_t threads,
                              at::Tensor** out) {
  return guarded([&] {
    *out = new at::Tensor(bench_fused::cross_entropy(*logits, *targets, ignore_index,
                                                     reuse_logits != 0, threads));
  });
}

// libtorch's profiler (Kineto, with CUPTI for the device's kernels), as torch.profiler runs
// it: what `BENCH_PROFILE` uses to trace one step of the worker.
int bench_profiler_start() {
  return guarded([&] {
    namespace pi = torch::profiler::impl;
    pi::ProfilerConfig cfg(pi::ProfilerState::KINETO);
    std::set<pi::ActivityType> acts{pi::ActivityType::CPU, pi::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(cfg, acts);
    torch::autograd::profiler::enableProfiler(cfg, acts);
  });
}

// Stops the profiler and writes its trace (Chrome trace JSON) to `path`.
int bench_profiler_stop(const char* path) {
  return guarded([&] { torch::autograd::profiler::disableProfiler()->save(path); });
}

// Fused LayerNorm: *out = LayerNorm(x) over the last dimension of x [rows, cols] with
// weight and bias [cols]; see fused.h.
int bench_fused_layer_norm(const at::Tensor* x, const at::Tensor* weight, const at::Tensor* bias,
                           double eps, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::layer_norm(*x, *weight, *bias, eps)); });
}

// Whether the fused LayerNorm takes x's rows (its dtype and last dimension); 0 or 1.
int bench_fused_layer_norm_supported(const at::Tensor* x) {
  return x->dim() > 0 && bench_fused::layer_norm_supported(x->scalar_type(), x->size(-1)) ? 1 : 0;
}

// Fused bias + GELU (tanh): *out = gelu(x + bias) for x [rows, cols], bias [cols].
int bench_fused_bias_gelu(const at::Tensor* x, const at::Tensor* bias, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::bias_gelu(*x, *bias)); });
}

// Whether the fused bias+GELU takes x's rows (its dtype and last dimension); 0 or 1.
int bench_fused_bias_gelu_supported(const at::Tensor* x) {
  return x->dim() > 0 && bench_fused::bias_gelu_supported(x->scalar_type(), x->size(-1)) ? 1 : 0;
}

// Fused RMSNorm: *out = rms_norm(x) * weight for x [rows, cols], weight [cols].
int bench_fused_rms_norm(const at::Tensor* x, const at::Tensor* weight, double eps,
                         at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::rms_norm(*x, *weight, eps)); });
}

// Whether the fused RMSNorm takes x's rows (its dtype and last dimension); 0 or 1.
int bench_fused_rms_norm_supported(const at::Tensor* x) {
  return x->dim() > 0 && bench_fused::rms_norm_supported(x->scalar_type(), x->size(-1)) ? 1 : 0;
}

// Fused SwiGLU: *out = silu(gate) * up.
int bench_fused_swiglu(const at::Tensor* gate, const at::Tensor* up, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::swiglu(*gate, *up)); });
}

// Whether the fused SwiGLU takes x's rows (its dtype and last dimension); 0 or 1.
int bench_fused_swiglu_supported(const at::Tensor* x) {
  return x->dim() > 0 && bench_fused::swiglu_supported(x->scalar_type(), x->size(-1)) ? 1 : 0;
}

// Fused linear with bias: *out = x @ w^T + b, the bias gradient by our column sum.
int bench_fused_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* b,
                       at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::linear_bias(*x, *w, *b)); });
}

// Whether the fused linear takes outputs of `out` columns of x's dtype; 0 or 1.
int bench_fused_linear_supported(const at::Tensor* x, int64_t out) {
  return bench_fused::linear_bias_supported(x->scalar_type(), out) ? 1 : 0;
}

// The fp32 column sums of x [rows, cols] by the fused linear's kernel.
int bench_column_sum(const at::Tensor* x, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(bench_fused::column_sum(*x)); });
}

// fp8 quantization as the fp8 linear does it: *q = fp8(t * scale), *inv_scale = 1 / scale,
// the scale a power of two from t's absolute maximum; e4m3fn if e4m3 is 1, else e5m2.
int bench_fp8_quantize(const at::Tensor* t, int e4m3, at::Tensor** q, at::Tensor** inv_scale) {
  return guarded([&] {
    auto [qq, s] = e4m3 ? quantize(*t, at::kFloat8_e4m3fn, kE4M3Max)
                        : quantize(*t, at::kFloat8_e5m2, kE5M2Max);
    *q = new at::Tensor(qq);
    *inv_scale = new at::Tensor(s);
  });
}

// The fp8 linear's transposing quantization of the matrix t: *q = fp8(t * scale), *qt = its
// transpose (row-major), *inv_scale = 1 / scale; through the one-pass transposing kernel
// where it applies, as in the fp8 linear.
// With a row (one operand's delayed-scaling state [kScalingCols]), as quantize_t does it
// under delayed scaling.
int bench_fp8_quantize_t(const at::Tensor* t, int e4m3, const at::Tensor* row, int primed,
                         at::Tensor** q, at::Tensor** qt, at::Tensor** inv_scale) {
  return guarded([&] {
    if (row != nullptr) check_scaling_state(*row, {kScalingCols}, *t, "fp8 quantization");
    Scaling sc{row == nullptr ? at::Tensor() : *row, primed != 0};
    auto r = e4m3 ? quantize_t(*t, at::kFloat8_e4m3fn, kE4M3Max, true, sc)
                  : quantize_t(*t, at::kFloat8_e5m2, kE5M2Max, true, sc);
    *q = new at::Tensor(r.q);
    *qt = new at::Tensor(r.qt);
    *inv_scale = new at::Tensor(r.inv_scale);
  });
}

// Compiles every fused kernel source for sm_<arch> with NVRTC, without a GPU (the LayerNorm
// at its widest, four vectors per lane); *bytes = the cubins' total size.
int bench_jit_compile_check(int64_t arch, int64_t* bytes) {
  return guarded([&] {
    int a = static_cast<int>(arch);
    size_t total = bench_jit::compile_cubin(bench_fused::cross_entropy_source(),
                                            "fused_cross_entropy", a).size();
    for (auto t : {at::kBFloat16, at::kFloat}) {
      total += bench_jit::compile_cubin(bench_fused::layer_norm_source(t, 4), "layer_norm", a)
                   .size();
      total += bench_jit::compile_cubin(bench_fused::bias_gelu_source(t), "bias_gelu", a).size();
      // The RMSNorm at the Llama proxy's width (4 vectors per thread in bf16, 8 in fp32).
      for (int64_t kv : {1, 4, 8})
        total += bench_jit::compile_cubin(bench_fused::rms_norm_source(t, kv), "rms_norm", a)
                     .size();
      total += bench_jit::compile_cubin(bench_fused::swiglu_source(t), "swiglu", a).size();
      total += bench_jit::compile_cubin(bench_fused::linear_source(t), "col_sum", a).size();
      for (auto f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2})
        total += bench_jit::compile_cubin(bench_fused::quantize_fp8_source(t, f8), "quant_fp8", a)
                     .size();
    }
    total += bench_jit::compile_cubin(bench_fused::master_adamw_source(), "master_adamw", a)
                 .size();
    *bytes = static_cast<int64_t>(total);
  });
}

// One AdamW step with libtorch's fused CUDA kernel over n parameters. `step` is one
// float tensor on the device, shared by all parameters and incremented here, so the whole
// update can be captured in a CUDA graph.
int bench_fused_adamw(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                      at::Tensor** exp_avg_sqs, int64_t n, at::Tensor* step, double lr,
                      double beta1, double beta2, double weight_decay, double eps) {
  return guarded([&] {
    std::vector<at::Tensor> p, g, m, v, s;
    p.reserve(n);
    g.reserve(n);
    m.reserve(n);
    v.reserve(n);
    s.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      p.push_back(*params[i]);
      g.push_back(*grads[i]);
      m.push_back(*exp_avgs[i]);
      v.push_back(*exp_avg_sqs[i]);
      s.push_back(*step);
    }
    step->add_(1.0);
    // The kernel reads each step tensor once per parameter; sharing one tensor is fine
    // because it is incremented once, before the kernel.
    at::_fused_adamw_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, false, false);
  });
}

// One step of the master-weight AdamW (csrc/fused_adamw.cpp) over n entries; `grads` may be
// null in mode 3 and `acc` in modes 0 and 4; `stream` null for the current stream.
int bench_master_adamw(at::Tensor** grads, const int64_t* offsets, const int64_t* numels,
                       const double* weight_decays, int64_t n, const at::Tensor* master,
                       const at::Tensor* exp_avg, const at::Tensor* exp_avg_sq,
                       const at::Tensor* work, const at::Tensor* acc, const at::Tensor* step,
                       double lr, double beta1, double beta2, double eps, int64_t mode,
                       void* stream) {
  return guarded([&] {
    // On `stream` when given (the update overlapped with the backward): everything the call
    // queues, and any copy it allocates, belongs to that stream.
    std::optional<c10::cuda::CUDAStreamGuard> on;
    if (stream != nullptr) {
      on.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                  master->get_device()));
    }
    std::vector<at::Tensor> g;
    if (grads != nullptr) {
      g.reserve(n);
      for (int64_t i = 0; i < n; ++i) g.push_back(*grads[i]);
    }
    bench_fused::master_adamw(g, std::vector<int64_t>(offsets, offsets + n),
                              std::vector<int64_t>(numels, numels + n),
                              std::vector<double>(weight_decays, weight_decays + n), *master,
                              *exp_avg, *exp_avg_sq, *work, acc ? *acc : at::Tensor(), *step,
                              lr, beta1, beta2, eps, mode);
  });
}

// Backward from a non-scalar `t` with incoming gradient `grad` (torch.autograd.backward).
int bench_backward_with_grad(const at::Tensor* t, const at::Tensor* grad) {
  return guarded([&] { torch::autograd::backward({*t}, {*grad}); });
}

// Drops a tensor's gradient (PyTorch's zero_grad(set_to_none=True)): the next backward then
// hands its gradient over instead of adding it into a zeroed buffer, which saves a zeroing
// and an addition kernel per parameter and step.
int bench_set_grad_none(at::Tensor* t) {
  return guarded([&] { t->mutable_grad().reset(); });
}

// Makes `g` the tensor's gradient. DDP and FSDP point every parameter's gradient at a view
// of its unit's flat buffer, so that the backward accumulates into it in place and the
// collective runs on the buffer with no flatten or unflatten copies.
int bench_set_grad(at::Tensor* t, const at::Tensor* g) {
  return guarded([&] { t->mutable_grad() = *g; });
}

// The raw cudaStream_t of the current stream of `device` (what NCCL calls are queued on, so
// they are ordered after the backward's kernels whatever stream libtorch made current).
int bench_cuda_current_stream(int64_t device, void** out) {
  return guarded([&] {
    *out = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  });
}

// Makes `device` the calling thread's current CUDA device (NCCL creates a communicator on
// the current device).
int bench_cuda_set_device(int64_t device) {
  return guarded([&] { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); });
}

// A stream of the pool for collectives (high priority, so they start as soon as they can).
int bench_cuda_comm_stream(int64_t device, void** out) {
  return guarded([&] {
    *out = c10::cuda::getStreamFromPool(true, static_cast<c10::DeviceIndex>(device)).stream();
  });
}

// Makes `waiter` wait for the work queued on `waited` so far (raw cudaStream_t values).
int bench_cuda_stream_wait(void* waiter, void* waited) {
  return guarded([&] {
    cudaEvent_t ev;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(waited)));
    C10_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), ev, 0));
    // The wait is already enqueued; destroying the event now is allowed.
    C10_CUDA_CHECK(cudaEventDestroy(ev));
  });
}

int bench_cuda_capability(int64_t device, int* major, int* minor) {
  return guarded([&] {
    auto* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    *major = prop->major;
    *minor = prop->minor;
  });
}

// Copies the device name (NUL-terminated, truncated to len - 1 bytes) into buf.
int bench_cuda_device_name(int64_t device, char* buf, int64_t len) {
  return guarded([&] {
    auto* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    std::strncpy(buf, prop->name, static_cast<size_t>(len - 1));
    buf[len - 1] = '\0';
  });
}

int bench_cuda_synchronize(int64_t device) {
  return guarded([&] {
    c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
    c10::cuda::device_synchronize();
  });
}

// Peak bytes allocated by the caching allocator since the last reset (all pools).
int bench_cuda_peak_allocated(int64_t device, int64_t* bytes) {
  return guarded([&] {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    *bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  });
}

int bench_cuda_reset_peak(int64_t device) {
  return guarded([&] {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

GraphState* bench_graph_new() {
  GraphState* s = nullptr;
  guarded([&] { s = new GraphState(); });
  return s;
}

void bench_graph_free(GraphState* s) { delete s; }

// Makes a side stream current (graph capture cannot run on the legacy default stream);
// the stream waits for the work already queued on the previous one.
int bench_graph_enter_stream(GraphState* s, int64_t device) {
  return guarded([&] {
    auto dev = static_cast<c10::DeviceIndex>(device);
    auto prev = c10::cuda::getCurrentCUDAStream(dev);
    if (!s->stream) s->stream = c10::cuda::getStreamFromPool(false, dev);
    at::cuda::CUDAEvent ev;
    ev.record(prev);
    ev.block(*s->stream);
    s->guard.emplace(*s->stream);
  });
}

// Restores the previous stream, which then waits for the side stream's work.
int bench_graph_exit_stream(GraphState* s) {
  return guarded([&] {
    if (!s->guard) return;
    auto side = *s->stream;
    s->guard.reset();
    at::cuda::CUDAEvent ev;
    ev.record(side);
    ev.block(c10::cuda::getCurrentCUDAStream(side.device_index()));
  });
}

int bench_graph_capture_begin(GraphState* s) {
  return guarded([&] { s->graph.capture_begin(); });
}

int bench_graph_capture_end(GraphState* s) {
  return guarded([&] { s->graph.capture_end(); });
}

int bench_graph_replay(GraphState* s) {
  return guarded([&] { s->graph.replay(); });
}

// --- FSDP: storage that comes and goes, events, and a backward from a given gradient ---

// Frees the memory behind a tensor's storage while keeping the storage object, so every
// tensor sharing it (the parameters that are views of an FSDP unit's flat buffer, and the
// autograd graph's saved references to them) stays valid and sees the memory again after
// bench_storage_allocate. When `stream` is not null the caching allocator is first told
// that the memory was used on that stream too (recordStream), so it is not handed out
// again before the work queued there, such as a reduce-scatter reading it, has finished.
int bench_storage_release(at::Tensor* t, void* stream) {
  return guarded([&] {
    auto* impl = t->storage().unsafeGetStorageImpl();
    if (stream != nullptr && impl->data_ptr().get() != nullptr && t->is_cuda()) {
      auto s = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                t->device().index());
      c10::cuda::CUDACachingAllocator::recordStream(impl->data_ptr(), s);
    }
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, t->device()));
    impl->set_nbytes(0);
  });
}

// Gives a released storage `nbytes` of fresh memory from its own allocator (the caching
// allocator on CUDA, on the current stream). The contents are undefined.
int bench_storage_allocate(at::Tensor* t, int64_t nbytes) {
  return guarded([&] {
    auto* impl = t->storage().unsafeGetStorageImpl();
    TORCH_CHECK(impl->allocator() != nullptr, "storage has no allocator");
    auto dp = impl->allocator()->allocate(static_cast<size_t>(nbytes));
    impl->set_data_ptr_noswap(std::move(dp));
    impl->set_nbytes(static_cast<size_t>(nbytes));
  });
}

// Bytes of memory behind a tensor's storage right now (0 once released).
int bench_storage_nbytes(const at::Tensor* t, int64_t* out) {
  return guarded([&] { *out = static_cast<int64_t>(t->storage().nbytes()); });
}

// A CUDA event for ordering work between streams (no timing).
int bench_event_new(void** out) {
  return guarded([&] {
    cudaEvent_t ev;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = ev;
  });
}

int bench_event_record(void* ev, void* stream) {
  return guarded([&] {
    C10_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream)));
  });
}

// Makes `stream` wait for the work recorded in `ev` (and nothing queued after it).
int bench_stream_wait_event(void* stream, void* ev) {
  return guarded([&] {
    C10_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(ev), 0));
  });
}

void bench_event_free(void* ev) {
  if (ev != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}

// Back-propagates `grad` from `out` (torch.autograd.backward(out, grad)): gradients
// accumulate into the leaves' .grad. FSDP drives its backward block by block with it.
int bench_backward(const at::Tensor* out, const at::Tensor* grad) {
  return guarded([&] { torch::autograd::backward({*out}, {*grad}); });
}

}  // extern "C"
