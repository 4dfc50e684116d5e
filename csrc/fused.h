// Fused ops of the shim whose CUDA kernels are compiled at run time (jit.h).

#pragma once

#include <ATen/ATen.h>

#include <string>

namespace bench_fused {

// Mean cross-entropy (fp32 scalar) of `logits` [N, V] (bf16 or fp32, CUDA) against int64
// `targets` [N]; rows whose target is `ignore_index` count neither in the sum nor in the
// mean. Differentiable in `logits` as a custom autograd Function. With `reuse_logits` the
// backward writes the gradient into the logits' own buffer (the caller promises that nothing
// else reads the logits after the forward; the version bump makes a second use fail loudly).
// `threads` per block, 0 for the default.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index, bool reuse_logits, int64_t threads);

// The CUDA C++ source of the cross-entropy kernels and their names (for a compile check).
const std::string& cross_entropy_source();

}  // namespace bench_fused
