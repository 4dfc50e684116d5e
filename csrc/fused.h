// Fused ops of the shim whose CUDA kernels are compiled at run time (jit.h).

#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace bench_fused {

// Mean cross-entropy (fp32 scalar) of `logits` [N, V] (bf16 or fp32, CUDA) against int64
// `targets` [N]; rows whose target is `ignore_index` count neither in the sum nor in the
// mean. Differentiable in `logits` as a custom autograd Function. With `reuse_logits` the
// backward writes the gradient into the logits' own buffer (the caller promises that nothing
// else reads the logits after the forward; the version bump makes a second use fail loudly).
// `threads` per block, 0 for the default.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index, bool reuse_logits, int64_t threads);

// The CUDA C++ source of the cross-entropy kernels (for a compile check).
const std::string& cross_entropy_source();

// LayerNorm over the last dimension of `input` [rows, cols] (bf16 or fp32, CUDA) with
// `weight` and `bias` [cols] (fp32 masters or any float dtype; their gradients come back in
// their own dtype). Differentiable in all three. Only where layer_norm_supported says so.
at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps);

// Rows the fused LayerNorm handles: a whole number of 16-byte vectors, at most four per lane
// of a warp (cols <= 1024 in bf16, 512 in fp32).
bool layer_norm_supported(at::ScalarType input_dtype, int64_t cols);

// The CUDA C++ source of the LayerNorm kernels for `kv` vectors per lane (for a compile check).
std::string layer_norm_source(at::ScalarType input_dtype, int64_t kv);

// gelu(input + bias) with the tanh approximation, over `input` [rows, cols] (bf16 or fp32,
// CUDA) and `bias` [cols] (the fp32 master or any float dtype; its gradient comes back in its
// own dtype). Differentiable in both. Only where bias_gelu_supported says so.
at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias);

// Rows the fused bias+GELU takes: a whole number of 16-byte vectors.
bool bias_gelu_supported(at::ScalarType input_dtype, int64_t cols);

// The CUDA C++ source of the bias+GELU kernels (for a compile check).
std::string bias_gelu_source(at::ScalarType input_dtype);

// RMSNorm over the last dimension of `input` [rows, cols] (bf16 or fp32, CUDA) with `weight`
// [cols] (fp32 masters or any float dtype; its gradient comes back in its own dtype).
// Differentiable in both. Only where rms_norm_supported says so.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps);

// Rows the fused RMSNorm handles: a whole number of 16-byte vectors, at most eight per
// thread of a 128-thread block (cols <= 8192 in bf16, 4096 in fp32).
bool rms_norm_supported(at::ScalarType input_dtype, int64_t cols);

// The CUDA C++ source of the RMSNorm kernels for `kv` vectors per thread (for a compile
// check).
std::string rms_norm_source(at::ScalarType input_dtype, int64_t kv);

// silu(gate) * up over two tensors of one shape and dtype (bf16 or fp32, CUDA).
// Differentiable in both. Only where swiglu_supported says so (of the last dimension).
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// Rows the fused SwiGLU takes: a whole number of 16-byte vectors.
bool swiglu_supported(at::ScalarType input_dtype, int64_t cols);

// The CUDA C++ source of the SwiGLU kernels (for a compile check).
std::string swiglu_source(at::ScalarType input_dtype);

// input @ weight^T + bias for input [..., in], weight [out, in] (both bf16 or both fp32, CUDA)
// and bias [out] (any float dtype; its gradient comes back in its dtype). Forward and the two
// matmul gradients as libtorch's linear; the bias gradient in our own column-sum kernel.
// Only where linear_bias_supported says so.
at::Tensor linear_bias(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias);

// Output widths the fused linear takes: a whole number of 16-byte vectors.
bool linear_bias_supported(at::ScalarType input_dtype, int64_t out);

// The fp32 column sums of `input` [rows, cols] with the fused linear's kernel (for tests).
at::Tensor column_sum(const at::Tensor& input);

// The CUDA C++ source of the column-sum kernel (for a compile check).
std::string linear_source(at::ScalarType input_dtype);

// fp8(t * scale[0]) in one pass, `fp8` e4m3fn or e5m2 (satfinite conversion; the fp8 linear's
// power-of-two scales keep every product in range, so it equals libtorch's cast). Only where
// quantize_fp8_supported says so. With an amax slot (one fp32 number on t's device, not
// null or undefined) the same pass also raises *amax to t's largest magnitude (delayed
// scaling records it for later steps' scales).
at::Tensor quantize_fp8(const at::Tensor& t, const at::Tensor& scale, at::ScalarType fp8,
                        const at::Tensor* amax = nullptr);

// Tensors the one-pass quantization takes: contiguous, 16-byte aligned bf16 or fp32 on a
// GPU, a whole number of 16-byte vectors long.
bool quantize_fp8_supported(const at::Tensor& t);

// The same quantization of a matrix [rows, cols], returning its fp8 transpose [cols, rows]
// (row-major) too, from the same pass: {q, qt}, q left undefined unless want_q. Only where
// quantize_fp8_t_supported says so. The amax slot as for quantize_fp8.
std::pair<at::Tensor, at::Tensor> quantize_fp8_t(const at::Tensor& t, const at::Tensor& scale,
                                                 at::ScalarType fp8, bool want_q,
                                                 const at::Tensor* amax = nullptr);

// Matrices the transposing quantization takes: quantize_fp8_supported, two dimensions, both
// multiples of 64 (its tile).
bool quantize_fp8_t_supported(const at::Tensor& t);

// The CUDA C++ source of the quantization kernel (for a compile check).
std::string quantize_fp8_source(at::ScalarType input_dtype, at::ScalarType fp8);

// One AdamW step (torch.optim.AdamW's fused kernel's arithmetic) of fp32 masters kept in flat
// buffers, writing the bf16 working copy `work` too. Entry i covers master[offsets[i]
// .. offsets[i] + numels[i]) (offsets on the 4-element grid) with weight decay
// weight_decays[i]. mode 0: update from `grads` (bf16, one per entry); 1: acc = grads; 2:
// acc += grads; 3: update from `acc` (fp32 like the masters; `grads` unused). Modes 0 and 3
// increment `step` (one fp32 number on the device) first. Capturable in a CUDA graph.
void master_adamw(const std::vector<at::Tensor>& grads, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& numels, const std::vector<double>& weight_decays,
                  const at::Tensor& master, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& work, const at::Tensor& acc,
                  const at::Tensor& step, double lr, double beta1, double beta2, double eps,
                  int64_t mode);

// The CUDA C++ source of the master AdamW kernel (for a compile check).
std::string master_adamw_source();

}  // namespace bench_fused
