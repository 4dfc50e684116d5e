//! fp8 linear layers: `_scaled_mm` with dynamic per-tensor scaling, e4m3 for activations
//! and weights in the forward pass and e5m2 for the incoming gradients, as a libtorch
//! custom autograd Function in the C++ shim (tch has no custom autograd functions).

use tch::Tensor;

use crate::workload::ffi;

/// `x @ w^T` for x `[.., K]` (bf16) and w `[N, K]` (bf16 or the fp32 master); the result is
/// `[.., N]` in x's dtype and w's gradient comes back in w's dtype.
///
/// Panics with the shim's message when the matmul fails (e.g. shapes not multiples of 16);
/// the worker's panic boundary turns that into an error event.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    let size = x.size();
    let k = *size.last().unwrap_or(&0);
    let x2 = x.reshape([-1, k]);
    let y = match ffi::fp8_linear(&x2, w) {
        Ok(y) => y,
        Err(e) => panic!("fp8 linear failed: {e}"),
    };
    let mut out = size.clone();
    if let Some(last) = out.last_mut() {
        *last = w.size()[0];
    }
    y.reshape(out.as_slice())
}
