//! Safe wrappers over the C++ shim (csrc/shim.cpp): the fp8 linear and fused cross-entropy
//! autograd Functions, the fused AdamW kernel, CUDA graphs and CUDA device queries. Every call returns the shim's
//! error text on failure; none of them may be made on a host without a CUDA device (the
//! callers check `tch::Cuda::is_available()` first).
//!
//! Why one file of this size: it is the Rust side of one C interface, the `extern "C"`
//! declarations mirroring csrc/shim.cpp's exports and a safe wrapper for each. Kept in one
//! file, a change to the shim's signatures is checked against one list, in one place;
//! split by kernel, the unsafe declarations would scatter while the C side stays one file.

use std::ffi::{c_char, c_int, c_void, CStr};

use tch::Tensor;
use torch_sys::C_tensor;

#[repr(C)]
pub(crate) struct RawGraph {
    _private: [u8; 0],
}

extern "C" {
    fn bench_last_error() -> *const c_char;
    fn bench_fp8_linear(
        x: *const C_tensor,
        w: *const C_tensor,
        st: *const C_tensor,
        primed: c_int,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fp8_scaling_cols() -> i64;
    fn bench_fp8_roll(st: *const C_tensor) -> c_int;
    fn bench_fused_cross_entropy(
        logits: *const C_tensor,
        targets: *const C_tensor,
        ignore_index: i64,
        reuse_logits: c_int,
        threads: i64,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_layer_norm(
        x: *const C_tensor,
        weight: *const C_tensor,
        bias: *const C_tensor,
        eps: f64,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_layer_norm_supported(x: *const C_tensor) -> c_int;
    fn bench_fused_bias_gelu(
        x: *const C_tensor,
        bias: *const C_tensor,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_bias_gelu_supported(x: *const C_tensor) -> c_int;
    fn bench_fused_rms_norm(
        x: *const C_tensor,
        weight: *const C_tensor,
        eps: f64,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_rms_norm_supported(x: *const C_tensor) -> c_int;
    fn bench_fused_swiglu(
        gate: *const C_tensor,
        up: *const C_tensor,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_swiglu_supported(x: *const C_tensor) -> c_int;
    fn bench_fused_linear(
        x: *const C_tensor,
        w: *const C_tensor,
        b: *const C_tensor,
        out: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fused_linear_supported(x: *const C_tensor, out: i64) -> c_int;
    fn bench_column_sum(x: *const C_tensor, out: *mut *mut C_tensor) -> c_int;
    fn bench_fp8_quantize(
        t: *const C_tensor,
        e4m3: c_int,
        q: *mut *mut C_tensor,
        inv_scale: *mut *mut C_tensor,
    ) -> c_int;
    fn bench_fp8_quantize_t(
        t: *const C_tensor,
        e4m3: c_int,
        row: *const C_tensor,
        primed: c_int,
        q: *mut *mut C_tensor,
        qt: *mut *mut C_tensor,
        inv_scale: *mut *mut C_tensor,
    ) -> c_int;
    #[cfg(test)]
    fn bench_jit_compile_check(arch: i64, bytes: *mut i64) -> c_int;
    fn bench_profiler_start() -> c_int;
    fn bench_profiler_stop(path: *const c_char) -> c_int;
    fn bench_fused_adamw(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        exp_avgs: *const *mut C_tensor,
        exp_avg_sqs: *const *mut C_tensor,
        n: i64,
        step: *mut C_tensor,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> c_int;
    fn bench_master_adamw(
        grads: *const *mut C_tensor,
        offsets: *const i64,
        numels: *const i64,
        weight_decays: *const f64,
        n: i64,
        master: *const C_tensor,
        exp_avg: *const C_tensor,
        exp_avg_sq: *const C_tensor,
        work: *const C_tensor,
        acc: *const C_tensor,
        step: *const C_tensor,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        mode: i64,
        stream: *mut c_void,
    ) -> c_int;
    fn bench_set_grad_none(t: *mut C_tensor) -> c_int;
    fn bench_backward_with_grad(t: *const C_tensor, grad: *const C_tensor) -> c_int;
    fn bench_set_grad(t: *mut C_tensor, g: *const C_tensor) -> c_int;
    fn bench_cuda_set_device(device: i64) -> c_int;
    fn bench_cuda_comm_stream(device: i64, out: *mut *mut c_void) -> c_int;
    fn bench_cuda_stream_wait(waiter: *mut c_void, waited: *mut c_void) -> c_int;
    fn bench_cuda_current_stream(device: i64, out: *mut *mut c_void) -> c_int;
    fn bench_cuda_capability(device: i64, major: *mut c_int, minor: *mut c_int) -> c_int;
    fn bench_cuda_device_name(device: i64, buf: *mut c_char, len: i64) -> c_int;
    fn bench_cuda_synchronize(device: i64) -> c_int;
    fn bench_cuda_peak_allocated(device: i64, bytes: *mut i64) -> c_int;
    fn bench_cuda_reset_peak(device: i64) -> c_int;
    fn bench_graph_new() -> *mut RawGraph;
    fn bench_graph_free(g: *mut RawGraph);
    fn bench_graph_enter_stream(g: *mut RawGraph, device: i64) -> c_int;
    fn bench_graph_exit_stream(g: *mut RawGraph) -> c_int;
    fn bench_graph_capture_begin(g: *mut RawGraph) -> c_int;
    fn bench_graph_capture_end(g: *mut RawGraph) -> c_int;
    fn bench_graph_replay(g: *mut RawGraph) -> c_int;
    fn bench_storage_release(t: *mut C_tensor, stream: *mut c_void) -> c_int;
    fn bench_storage_allocate(t: *mut C_tensor, nbytes: i64) -> c_int;
    #[cfg(test)]
    fn bench_storage_nbytes(t: *const C_tensor, out: *mut i64) -> c_int;
    fn bench_event_new(out: *mut *mut c_void) -> c_int;
    fn bench_event_record(ev: *mut c_void, stream: *mut c_void) -> c_int;
    fn bench_stream_wait_event(stream: *mut c_void, ev: *mut c_void) -> c_int;
    fn bench_event_free(ev: *mut c_void);
    fn bench_backward(out: *const C_tensor, grad: *const C_tensor) -> c_int;
}

fn check(rc: c_int) -> Result<(), String> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the shim returns a pointer to its thread-local, NUL-terminated error string.
    let msg = unsafe { CStr::from_ptr(bench_last_error()) };
    Err(msg.to_string_lossy().into_owned())
}

/// `x [M, K] @ w[N, K]^T` with fp8 matmuls, differentiable in both arguments (bf16 in/out).
/// `delayed` is the linear's delayed-scaling state (`[3, fp8_scaling_cols()]` fp32 on x's
/// device) and whether a roll has filled its scales; `None` scales dynamically.
pub(crate) fn fp8_linear(
    x: &Tensor,
    w: &Tensor,
    delayed: Option<(&Tensor, bool)>,
) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    let (st, primed) = delayed_args(delayed);
    // SAFETY: x, w and st (when not null) are live tensors; on success the shim hands over a
    // new at::Tensor*.
    check(unsafe { bench_fp8_linear(x.as_ptr(), w.as_ptr(), st, primed, &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// The shim's arguments for an optional delayed-scaling state: its pointer (null for
/// dynamic scaling) and whether it is primed.
fn delayed_args(delayed: Option<(&Tensor, bool)>) -> (*const C_tensor, c_int) {
    match delayed {
        Some((st, primed)) => (st.as_ptr(), c_int::from(primed)),
        None => (std::ptr::null(), 0),
    }
}

/// Columns of one operand's delayed-scaling row: scale, inverse, this step's amax and the
/// history before it.
pub fn fp8_scaling_cols() -> i64 {
    // SAFETY: a constant from the shim.
    unsafe { bench_fp8_scaling_cols() }
}

/// Turns the delayed-scaling state `[sites, 3, fp8_scaling_cols()]` over after an optimizer
/// step (csrc/shim.cpp's fp8_roll).
pub fn fp8_roll(st: &Tensor) -> Result<(), String> {
    // SAFETY: st is a live tensor.
    check(unsafe { bench_fp8_roll(st.as_ptr()) })
}

/// Mean cross-entropy (fp32 scalar) of CUDA `logits [N, V]` (bf16 or fp32) against int64
/// `targets [N]`, skipping rows whose target is `ignore_index`, through the shim's fused
/// kernels (csrc/fused_ce.cpp); differentiable in `logits`. With `reuse_logits` the backward
/// writes the gradient into the logits' buffer: only for logits nothing else reads after
/// the loss. `threads` per block, 0 for the shim's default.
pub fn fused_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: i64,
    reuse_logits: bool,
    threads: i64,
) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: both are live tensors; on success the shim hands over a new at::Tensor*.
    check(unsafe {
        bench_fused_cross_entropy(
            logits.as_ptr(),
            targets.as_ptr(),
            ignore_index,
            c_int::from(reuse_logits),
            threads,
            &mut out,
        )
    })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// LayerNorm over the last dimension of CUDA `x [rows, cols]` (bf16 or fp32) with `weight`
/// and `bias [cols]` (the fp32 masters: their gradients come back in fp32), through the
/// shim's fused kernels (csrc/fused_ln.cpp); differentiable in all three. Only for rows that
/// [`fused_layer_norm_supported`] accepts.
pub fn fused_layer_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands over a new at::Tensor*.
    check(unsafe {
        bench_fused_layer_norm(x.as_ptr(), weight.as_ptr(), bias.as_ptr(), eps, &mut out)
    })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether the fused LayerNorm takes `x`'s rows: bf16 or fp32, a whole number of 16-byte
/// vectors, at most 1024 bf16 or 512 fp32 elements (GPT-2 125M and 350M).
pub fn fused_layer_norm_supported(x: &Tensor) -> bool {
    // SAFETY: a live tensor; the shim only reads its dtype and sizes.
    unsafe { bench_fused_layer_norm_supported(x.as_ptr()) == 1 }
}

/// `gelu(x + bias)` (tanh approximation) over CUDA `x [rows, cols]` (bf16 or fp32) with
/// `bias [cols]` (the fp32 master: its gradient comes back in fp32), through the shim's fused
/// kernels (csrc/fused_gelu.cpp), whose backward also sums the bias gradient; differentiable
/// in both. Only for rows that [`fused_bias_gelu_supported`] accepts.
pub fn fused_bias_gelu(x: &Tensor, bias: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands over a new at::Tensor*.
    check(unsafe { bench_fused_bias_gelu(x.as_ptr(), bias.as_ptr(), &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether the fused bias+GELU takes `x`'s rows: bf16 or fp32, a whole number of 16-byte
/// vectors.
pub fn fused_bias_gelu_supported(x: &Tensor) -> bool {
    // SAFETY: a live tensor; the shim only reads its dtype and sizes.
    unsafe { bench_fused_bias_gelu_supported(x.as_ptr()) == 1 }
}

/// RMSNorm over the last dimension of CUDA `x [rows, cols]` (bf16 or fp32) with `weight
/// [cols]` (the fp32 master or a bf16 working copy: its gradient comes back in its own
/// dtype), through the shim's fused kernels (csrc/fused_rms.cpp), whose backward also sums
/// the weight gradient; differentiable in both. Only for rows that
/// [`fused_rms_norm_supported`] accepts.
pub fn fused_rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands over a new at::Tensor*.
    check(unsafe { bench_fused_rms_norm(x.as_ptr(), weight.as_ptr(), eps, &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether the fused RMSNorm takes `x`'s rows: bf16 or fp32, a whole number of 16-byte
/// vectors, at most 8192 bf16 or 4096 fp32 elements.
pub fn fused_rms_norm_supported(x: &Tensor) -> bool {
    // SAFETY: a live tensor; the shim only reads its dtype and sizes.
    unsafe { bench_fused_rms_norm_supported(x.as_ptr()) == 1 }
}

/// `silu(gate) * up` over two CUDA tensors of one shape and dtype (bf16 or fp32), through the
/// shim's fused kernels (csrc/fused_swiglu.cpp); differentiable in both. Only for rows that
/// [`fused_swiglu_supported`] accepts.
pub fn fused_swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands over a new at::Tensor*.
    check(unsafe { bench_fused_swiglu(gate.as_ptr(), up.as_ptr(), &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether the fused SwiGLU takes `x`'s rows: bf16 or fp32, a whole number of 16-byte
/// vectors.
pub fn fused_swiglu_supported(x: &Tensor) -> bool {
    // SAFETY: a live tensor; the shim only reads its dtype and sizes.
    unsafe { bench_fused_swiglu_supported(x.as_ptr()) == 1 }
}

/// `x @ w^T + b` for x `[..., in]`, w `[out, in]` in x's dtype, b `[out]` in any float dtype,
/// by the shim's fused linear (csrc/fused_linear.cpp): libtorch's addmm and matmul
/// gradients, the bias gradient by our column-sum kernel. Only where
/// [`fused_linear_supported`] accepts.
pub fn fused_linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: the inputs are live tensors; on success the shim hands over a new tensor.
    check(unsafe { bench_fused_linear(x.as_ptr(), w.as_ptr(), b.as_ptr(), &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Whether the fused linear takes `out` output columns of x's dtype.
pub fn fused_linear_supported(x: &Tensor, out: i64) -> bool {
    // SAFETY: reads the tensor's dtype only.
    unsafe { bench_fused_linear_supported(x.as_ptr(), out) == 1 }
}

/// The fp32 column sums of `x` `[rows, cols]` by the fused linear's kernel (for tests).
pub fn column_sum(x: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: x is a live tensor; on success the shim hands over a new tensor.
    check(unsafe { bench_column_sum(x.as_ptr(), &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// The fp8 linear's quantization of `t` (e4m3fn, or e5m2 as for gradients): the fp8 tensor
/// and the inverse scale `_scaled_mm` multiplies back in. Takes the one-pass kernel unless
/// `BENCH_FUSED_FP8=0` (read once per process).
pub fn fp8_quantize(t: &Tensor, e4m3: bool) -> Result<(Tensor, Tensor), String> {
    let (mut q, mut s): (*mut C_tensor, *mut C_tensor) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: t is a live tensor; on success the shim hands over two new tensors.
    check(unsafe { bench_fp8_quantize(t.as_ptr(), c_int::from(e4m3), &mut q, &mut s) })?;
    Ok(unsafe { (Tensor::from_ptr(q), Tensor::from_ptr(s)) })
}

/// The fp8 linear's transposing quantization of the matrix `t`: the fp8 tensor, its transpose
/// (row-major) and the inverse scale, through the one-pass transposing kernel where it applies
/// (both sides multiples of 64) unless `BENCH_FUSED_FP8T=0` or `BENCH_FUSED_FP8=0`.
pub fn fp8_quantize_t(t: &Tensor, e4m3: bool) -> Result<(Tensor, Tensor, Tensor), String> {
    quantize_t(t, e4m3, None)
}

/// [`fp8_quantize_t`] under delayed scaling, as the fp8 linear quantizes one operand: `row`
/// is the operand's state (`[fp8_scaling_cols()]` fp32: scale, inverse, this step's amax,
/// history); scaled by its scale when `primed`, dynamically before, and either way raises
/// the row's amax slot to `t`'s largest magnitude.
pub fn fp8_quantize_t_delayed(
    t: &Tensor,
    e4m3: bool,
    row: &Tensor,
    primed: bool,
) -> Result<(Tensor, Tensor, Tensor), String> {
    quantize_t(t, e4m3, Some((row, primed)))
}

fn quantize_t(
    t: &Tensor,
    e4m3: bool,
    delayed: Option<(&Tensor, bool)>,
) -> Result<(Tensor, Tensor, Tensor), String> {
    let mut out: [*mut C_tensor; 3] = [std::ptr::null_mut(); 3];
    let [q, qt, s] = &mut out;
    let (row, primed) = delayed_args(delayed);
    // SAFETY: t and row (when not null) are live tensors; on success the shim hands over
    // three new tensors.
    check(unsafe { bench_fp8_quantize_t(t.as_ptr(), c_int::from(e4m3), row, primed, q, qt, s) })?;
    Ok(unsafe {
        (
            Tensor::from_ptr(out[0]),
            Tensor::from_ptr(out[1]),
            Tensor::from_ptr(out[2]),
        )
    })
}

/// Compiles the shim's run-time kernels for `sm_<arch>` with NVRTC (no GPU needed) and
/// returns the cubin's size: what a CPU test can check of them.
#[cfg(test)]
pub(crate) fn jit_compile_check(arch: i64) -> Result<usize, String> {
    let mut bytes = 0i64;
    check(unsafe { bench_jit_compile_check(arch, &mut bytes) })?;
    Ok(bytes.max(0) as usize)
}

/// Starts libtorch's profiler (host ops and, through CUPTI, device kernels).
pub(crate) fn profiler_start() -> Result<(), String> {
    check(unsafe { bench_profiler_start() })
}

/// Stops the profiler and writes its Chrome-trace JSON to `path`.
pub(crate) fn profiler_stop(path: &std::path::Path) -> Result<(), String> {
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
    check(unsafe { bench_profiler_stop(c.as_ptr()) })
}

/// One fused AdamW step over equally long lists of fp32 CUDA tensors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    step: &mut Tensor,
    lr: f64,
    betas: (f64, f64),
    weight_decay: f64,
    eps: f64,
) -> Result<(), String> {
    let n = params.len();
    if grads.len() != n || exp_avgs.len() != n || exp_avg_sqs.len() != n {
        return Err("fused_adamw: tensor lists differ in length".into());
    }
    let ptrs = |ts: &[Tensor]| {
        ts.iter()
            .map(|t| t.as_ptr() as *mut C_tensor)
            .collect::<Vec<_>>()
    };
    let (p, g, m, v) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs));
    // SAFETY: all pointers are live tensors borrowed for the duration of the call.
    check(unsafe {
        bench_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n as i64,
            step.as_mut_ptr(),
            lr,
            betas.0,
            betas.1,
            weight_decay,
            eps,
        )
    })
}

/// What one call of [`master_adamw`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterMode {
    /// Update the masters from the entries' bf16 gradients.
    Update = 0,
    /// Copy the gradients into the fp32 accumulator (the first micro-batch).
    AccAssign = 1,
    /// Add the gradients into the accumulator (later micro-batches).
    AccAdd = 2,
    /// Update the masters from the accumulator.
    UpdateFromAcc = 3,
    /// [`MasterMode::Update`] of some of the entries, the step already counted
    /// ([`crate::workload::optim::AdamW::count_step`]): one launch per stage of the model
    /// when the update overlaps the backward.
    UpdateCounted = 4,
}

/// The flat fp32 buffers behind [`master_adamw`]: masters, moments, the bf16 working copy,
/// the accumulator (for gradient accumulation) and the device step count.
pub(crate) struct MasterBuffers<'a> {
    pub master: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
    pub work: &'a Tensor,
    pub acc: Option<&'a Tensor>,
    pub step: &'a Tensor,
}

/// One pass of the shim's master-weight AdamW kernel (csrc/fused_adamw.cpp): entry i is
/// `offsets[i]..offsets[i] + numels[i]` of the flat buffers with weight decay
/// `weight_decays[i]`; `grads` are the entries' bf16 gradients (unused, may be empty, for
/// [`MasterMode::UpdateFromAcc`]). Queued on `stream` (a live `cudaStream_t` of the
/// masters' device), else on the current stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn master_adamw(
    grads: &[Tensor],
    offsets: &[i64],
    numels: &[i64],
    weight_decays: &[f64],
    bufs: &MasterBuffers,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    mode: MasterMode,
    stream: Option<*mut c_void>,
) -> Result<(), String> {
    let n = offsets.len();
    if numels.len() != n || weight_decays.len() != n {
        return Err("master_adamw: entry lists differ in length".into());
    }
    let g: Vec<*mut C_tensor> = grads.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
    let null = std::ptr::null::<C_tensor>();
    // SAFETY: all pointers are live tensors (or null where the shim allows it) borrowed for
    // the duration of the call; the lists are n long (checked above and by the shim).
    check(unsafe {
        bench_master_adamw(
            if g.is_empty() {
                std::ptr::null()
            } else {
                g.as_ptr()
            },
            offsets.as_ptr(),
            numels.as_ptr(),
            weight_decays.as_ptr(),
            n as i64,
            bufs.master.as_ptr(),
            bufs.exp_avg.as_ptr(),
            bufs.exp_avg_sq.as_ptr(),
            bufs.work.as_ptr(),
            bufs.acc.map_or(null, |t| t.as_ptr()),
            bufs.step.as_ptr(),
            lr,
            betas.0,
            betas.1,
            eps,
            mode as i64,
            stream.unwrap_or(std::ptr::null_mut()),
        )
    })
}

/// Backward from `t` with `grad` as its incoming gradient (tch's `backward` takes scalars
/// only): what the kernel benchmarks time a layer's backward with, free of a loss's kernels.
pub fn backward_with_grad(t: &Tensor, grad: &Tensor) -> Result<(), String> {
    check(unsafe { bench_backward_with_grad(t.as_ptr(), grad.as_ptr()) })
}

/// Drops the tensor's `.grad` (safe on any device: plain autograd bookkeeping).
pub fn set_grad_none(t: &mut Tensor) -> Result<(), String> {
    check(unsafe { bench_set_grad_none(t.as_mut_ptr()) })
}

/// Makes `g` the gradient of `t` (same shape and dtype); later backwards accumulate into it.
pub fn set_grad(t: &mut Tensor, g: &Tensor) -> Result<(), String> {
    check(unsafe { bench_set_grad(t.as_mut_ptr(), g.as_ptr()) })
}

/// A high-priority stream of the device's pool, for collectives.
pub(crate) fn cuda_comm_stream(device: i64) -> Result<*mut c_void, String> {
    let mut s: *mut c_void = std::ptr::null_mut();
    check(unsafe { bench_cuda_comm_stream(device, &mut s) })?;
    Ok(s)
}

/// Makes stream `waiter` wait for the work queued on `waited` so far.
///
/// # Safety
/// Both must be live `cudaStream_t` values (null: the legacy default stream).
pub(crate) unsafe fn cuda_stream_wait(
    waiter: *mut c_void,
    waited: *mut c_void,
) -> Result<(), String> {
    check(unsafe { bench_cuda_stream_wait(waiter, waited) })
}

/// Makes `device` this thread's current CUDA device.
pub(crate) fn cuda_set_device(device: i64) -> Result<(), String> {
    check(unsafe { bench_cuda_set_device(device) })
}

/// The raw `cudaStream_t` of the device's current stream (null for the legacy default).
pub(crate) fn cuda_current_stream(device: i64) -> Result<*mut c_void, String> {
    let mut s: *mut c_void = std::ptr::null_mut();
    check(unsafe { bench_cuda_current_stream(device, &mut s) })?;
    Ok(s)
}

pub fn cuda_capability(device: i64) -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    check(unsafe { bench_cuda_capability(device, &mut major, &mut minor) })?;
    Ok((major, minor))
}

pub(crate) fn cuda_device_name(device: i64) -> Result<String, String> {
    let mut buf = vec![0 as c_char; 256];
    check(unsafe { bench_cuda_device_name(device, buf.as_mut_ptr(), buf.len() as i64) })?;
    // SAFETY: the shim NUL-terminates within the buffer.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

pub(crate) fn cuda_synchronize(device: i64) -> Result<(), String> {
    check(unsafe { bench_cuda_synchronize(device) })
}

pub(crate) fn cuda_peak_allocated(device: i64) -> Result<u64, String> {
    let mut b = 0i64;
    check(unsafe { bench_cuda_peak_allocated(device, &mut b) })?;
    Ok(b.max(0) as u64)
}

pub(crate) fn cuda_reset_peak(device: i64) -> Result<(), String> {
    check(unsafe { bench_cuda_reset_peak(device) })
}

/// A CUDA graph and the side stream it is captured on.
pub struct CudaGraph {
    raw: *mut RawGraph,
    device: i64,
}

impl CudaGraph {
    pub fn new(device: i64) -> Result<Self, String> {
        let raw = unsafe { bench_graph_new() };
        if raw.is_null() {
            return Err(check(1).err().unwrap_or_default());
        }
        Ok(CudaGraph { raw, device })
    }

    /// Runs `f` with the graph's side stream current (warm-up before capture).
    pub fn on_side_stream<T>(&mut self, f: impl FnOnce() -> T) -> Result<T, String> {
        check(unsafe { bench_graph_enter_stream(self.raw, self.device) })?;
        let out = f();
        check(unsafe { bench_graph_exit_stream(self.raw) })?;
        Ok(out)
    }

    /// Captures what `f` queues on the device into the graph.
    pub fn capture<T>(&mut self, f: impl FnOnce() -> T) -> Result<T, String> {
        check(unsafe { bench_graph_enter_stream(self.raw, self.device) })?;
        if let Err(e) = check(unsafe { bench_graph_capture_begin(self.raw) }) {
            let _ = check(unsafe { bench_graph_exit_stream(self.raw) });
            return Err(e);
        }
        let out = f();
        let end = check(unsafe { bench_graph_capture_end(self.raw) });
        let exit = check(unsafe { bench_graph_exit_stream(self.raw) });
        end?;
        exit?;
        Ok(out)
    }

    pub fn replay(&mut self) -> Result<(), String> {
        check(unsafe { bench_graph_replay(self.raw) })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        unsafe { bench_graph_free(self.raw) }
    }
}

/// Frees the memory behind `t`'s storage, keeping the storage object (and every tensor that
/// shares it) alive; see [`storage_allocate`]. With `stream` set, the caching allocator
/// first records that the memory is in use on that stream too, so it is not reused before
/// the work queued there has finished. Works on any device.
///
/// # Safety
/// No tensor sharing the storage may be read or written until it is allocated again, and
/// `stream`, when not null, must be a live CUDA stream of the tensor's device.
pub(crate) unsafe fn storage_release(t: &Tensor, stream: *mut c_void) -> Result<(), String> {
    check(bench_storage_release(t.as_ptr() as *mut C_tensor, stream))
}

/// Gives `t`'s (released) storage `nbytes` of fresh, uninitialised memory from its own
/// allocator (on CUDA: the caching allocator, on the current stream).
pub(crate) fn storage_allocate(t: &Tensor, nbytes: usize) -> Result<(), String> {
    check(unsafe { bench_storage_allocate(t.as_ptr() as *mut C_tensor, nbytes as i64) })
}

/// Bytes of memory behind `t`'s storage now (0 after [`storage_release`]).
#[cfg(test)]
pub(crate) fn storage_nbytes(t: &Tensor) -> Result<usize, String> {
    let mut n = 0i64;
    check(unsafe { bench_storage_nbytes(t.as_ptr(), &mut n) })?;
    Ok(n.max(0) as usize)
}

/// `torch.autograd.backward(out, grad)`: gradients accumulate into the leaves' `.grad`.
pub(crate) fn backward_with(out: &Tensor, grad: &Tensor) -> Result<(), String> {
    check(unsafe { bench_backward(out.as_ptr(), grad.as_ptr()) })
}

/// A CUDA event (no timing) for ordering work between two streams.
pub(crate) struct CudaEvent {
    raw: *mut c_void,
}

impl CudaEvent {
    pub(crate) fn new() -> Result<Self, String> {
        let mut raw = std::ptr::null_mut();
        check(unsafe { bench_event_new(&mut raw) })?;
        Ok(CudaEvent { raw })
    }

    /// Records the work queued on `stream` so far.
    ///
    /// # Safety
    /// `stream` must be a live CUDA stream of the event's device.
    pub(crate) unsafe fn record(&self, stream: *mut c_void) -> Result<(), String> {
        check(bench_event_record(self.raw, stream))
    }

    /// Makes `stream` wait for the work last recorded in this event.
    ///
    /// # Safety
    /// `stream` must be a live CUDA stream of the event's device.
    pub(crate) unsafe fn block(&self, stream: *mut c_void) -> Result<(), String> {
        check(bench_stream_wait_event(stream, self.raw))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        unsafe { bench_event_free(self.raw) }
    }
}
