//! Data-parallel training (DDP) of the built-in workload: one process per GPU, joined
//! through the rendezvous ([`crate::dist::rendezvous`]) into one NCCL communicator.
//!
//! Rank 0's initial parameters are broadcast to every rank. Every parameter's gradient is
//! a view of one flat, preallocated buffer per dtype, laid out in reverse parameter order
//! (the order the backward produces gradients) and cut into buckets of about 64 MiB, so
//! the backward accumulates straight into them and `ncclAllReduce(avg)` works on them in
//! place, with no flatten or unflatten copies.
//!
//! Overlap with the backward (on by default; `BENCH_DDP_OVERLAP=0` turns it off): a hook
//! on every parameter's gradient accumulator (through the C++ shim) counts the gradients
//! that arrive during the last micro-batch's backward; once a bucket has all of its own,
//! its all-reduce is queued on a separate communication stream (after an event on the
//! stream that produced them), while the backward of earlier layers goes on. Buckets are
//! launched strictly in order, so every rank issues the same collectives in the same
//! order. How many gradients each parameter receives per backward (more than one for a
//! weight used twice, or under checkpointing) is learned in the first step, which reduces
//! after the backward; a gradient arriving after its bucket was launched is an error,
//! never a silent wrong sum.
//!
//! The communicator, the rendezvous and the collectives of the step's bookkeeping (mean
//! loss, slowest step time, every rank's memory) are the [`Group`]'s.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use super::ffi;
use super::group::{nccl_dtype, Group};
use super::models::Param;
use super::WorkerError;
use crate::dist::nccl::{Comm, DataType, RedOp};

/// Target size of one all-reduce bucket.
const BUCKET_BYTES: usize = 64 << 20;

/// A contiguous range of a flat gradient buffer, reduced by one collective.
struct Bucket {
    /// Device address and element count (the buffer is owned by `Ddp::flats`).
    ptr: usize,
    numel: usize,
    dtype: DataType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Gradients arriving are not watched (earlier micro-batches, or overlap off).
    Idle,
    /// First step: count the gradients each parameter receives in one backward.
    Learn,
    /// Launch each bucket's all-reduce once its gradients are in.
    Armed,
}

struct OverlapState {
    mode: Mode,
    /// Per parameter: gradients received in the learning backward.
    calls: Vec<u32>,
    /// Per bucket: gradients expected per backward (`None` until learned).
    expected: Option<Vec<u32>>,
    /// Per bucket: gradients still to come in the armed backward.
    remaining: Vec<u32>,
    /// The next bucket to launch; buckets below it are launched.
    next: usize,
    error: Option<String>,
}

/// What the gradient hooks (on libtorch's autograd thread) share with the trainer.
struct Overlap {
    comm: Arc<Mutex<Option<Comm>>>,
    index: i64,
    /// The communication stream (a raw `cudaStream_t`).
    stream: usize,
    buckets: Vec<Bucket>,
    param_bucket: Vec<usize>,
    param_names: Vec<String>,
    st: Mutex<OverlapState>,
}

/// The hook's entry from C++: never unwinds (a panic is recorded as an error).
unsafe extern "C" fn on_grad_ready(ctx: *mut c_void, index: i64) {
    // SAFETY: `ctx` is the `Overlap` leaked in `Ddp::attach`, valid for the process.
    let ov = unsafe { &*(ctx as *const Overlap) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ov.ready(index as usize)));
    if r.is_err() {
        if let Ok(mut st) = ov.st.lock() {
            st.error
                .get_or_insert_with(|| "ddp: gradient hook panicked".into());
        }
    }
}

impl Overlap {
    fn lock(&self) -> std::sync::MutexGuard<'_, OverlapState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ready(&self, i: usize) {
        let mut st = self.lock();
        match st.mode {
            Mode::Idle => {}
            Mode::Learn => {
                if let Some(c) = st.calls.get_mut(i) {
                    *c += 1;
                }
            }
            Mode::Armed => {
                let Some(&b) = self.param_bucket.get(i) else {
                    return;
                };
                if st.remaining[b] == 0 {
                    let name = self.param_names.get(i).cloned().unwrap_or_default();
                    st.error.get_or_insert_with(|| {
                        format!("ddp: parameter {name} received a gradient after its bucket was reduced")
                    });
                    return;
                }
                st.remaining[b] -= 1;
                if let Err(e) = self.launch_ready(&mut st, false) {
                    st.error.get_or_insert(e);
                }
            }
        }
    }

    /// Launches, in order, every bucket whose gradients are all in (every remaining
    /// bucket when `all`, after the backward).
    fn launch_ready(&self, st: &mut OverlapState, all: bool) -> Result<(), String> {
        while st.next < self.buckets.len() && (all || st.remaining[st.next] == 0) {
            let b = &self.buckets[st.next];
            let cur = ffi::cuda_current_stream(self.index)?;
            let comm_stream = self.stream as *mut c_void;
            // SAFETY: both are streams of this device (the pool's and libtorch's current).
            unsafe { ffi::cuda_stream_wait(comm_stream, cur) }?;
            let g = self.comm.lock().map_err(|_| "communicator lock poisoned")?;
            let comm = g.as_ref().ok_or("communicator aborted")?;
            let ptr = b.ptr as *mut c_void;
            // SAFETY: the bucket is a live device range of `numel` elements of `dtype`
            // (owned by `Ddp::flats` for the run); the comm stream waits for the stream
            // that accumulated it, and the trainer's stream waits for the comm stream
            // before the optimizer reads it.
            unsafe { comm.all_reduce(ptr, ptr, b.numel, b.dtype, RedOp::Avg, comm_stream) }
                .map_err(|e| e.to_string())?;
            st.remaining[st.next] = 0;
            st.next += 1;
        }
        Ok(())
    }
}

/// DDP's gradient buckets on top of the rank's [`Group`].
pub struct Ddp<'a> {
    pub group: &'a Group,
    /// The flat gradient buffers, one per dtype (every gradient is a view into one).
    flats: Vec<Tensor>,
    /// The buckets and, with overlap on, the state shared with the gradient hooks; leaked
    /// on purpose (the hooks live as long as the process). `None` before `attach`.
    overlap: Option<&'static Overlap>,
    overlap_on: bool,
}

impl<'a> Ddp<'a> {
    pub fn new(group: &'a Group) -> Ddp<'a> {
        Ddp {
            group,
            flats: Vec::new(),
            overlap: None,
            overlap_on: false,
        }
    }

    pub fn rank(&self) -> u32 {
        self.group.rank()
    }

    pub fn world_size(&self) -> u32 {
        self.group.world_size()
    }

    /// Broadcasts rank 0's parameters to every rank, then points every parameter's
    /// gradient at its slice of a flat bucket of its dtype.
    pub fn attach(&mut self, params: &[Param]) -> Result<(), WorkerError> {
        self.group.broadcast_params(params)?;

        // Reverse order: the backward produces the last layers' gradients first.
        let mut by_kind: BTreeMap<i32, Vec<(usize, &Param)>> = BTreeMap::new();
        for (i, p) in params.iter().enumerate().rev() {
            if !p.tensor.is_contiguous() {
                return Err(WorkerError::Internal(format!(
                    "ddp: parameter {} is not contiguous",
                    p.name
                )));
            }
            by_kind
                .entry(nccl_dtype(p.tensor.kind()).map_or(-1, |d| d as i32))
                .or_default()
                .push((i, p));
        }
        let mut buckets = Vec::new();
        let mut param_bucket = vec![0usize; params.len()];
        for ps in by_kind.values() {
            let kind = ps[0].1.tensor.kind();
            let dtype = nccl_dtype(kind).ok_or_else(|| {
                WorkerError::Unsupported(format!(
                    "ddp: parameter {} has dtype {kind:?}, which NCCL cannot reduce",
                    ps[0].1.name
                ))
            })?;
            let numel: usize = ps.iter().map(|(_, p)| p.tensor.numel()).sum();
            let flat = Tensor::zeros([numel as i64], (kind, self.group.device));
            let elem = flat.kind().elt_size_in_bytes();
            let base = flat.data_ptr() as usize;
            let (mut off, mut start) = (0usize, 0usize);
            for (k, (i, p)) in ps.iter().enumerate() {
                let n = p.tensor.numel();
                let view = flat
                    .narrow(0, off as i64, n as i64)
                    .view(p.tensor.size().as_slice());
                let mut t = p.tensor.shallow_clone();
                ffi::set_grad(&mut t, &view).map_err(WorkerError::Internal)?;
                param_bucket[*i] = buckets.len();
                off += n;
                if (off - start) * elem >= BUCKET_BYTES || k + 1 == ps.len() {
                    buckets.push(Bucket {
                        ptr: base + start * elem,
                        numel: off - start,
                        dtype,
                    });
                    start = off;
                }
            }
            self.flats.push(flat);
        }
        let overlap_on = std::env::var("BENCH_DDP_OVERLAP").map_or(true, |v| v != "0");
        let stream = if overlap_on {
            ffi::cuda_comm_stream(self.group.index).map_err(WorkerError::Internal)? as usize
        } else {
            0
        };
        let ov = Box::leak(Box::new(Overlap {
            comm: Arc::clone(&self.group.comm),
            index: self.group.index,
            stream,
            buckets,
            param_bucket,
            param_names: params.iter().map(|p| p.name.clone()).collect(),
            st: Mutex::new(OverlapState {
                mode: Mode::Idle,
                calls: vec![0; params.len()],
                expected: None,
                remaining: Vec::new(),
                next: 0,
                error: None,
            }),
        }));
        if overlap_on {
            let tensors: Vec<Tensor> = params.iter().map(|p| p.tensor.shallow_clone()).collect();
            // SAFETY: `ov` is leaked, so valid for the rest of the process, and `Overlap`
            // is Sync (all its mutable state is behind mutexes).
            unsafe {
                ffi::grad_ready_hooks(&tensors, on_grad_ready, ov as *const Overlap as *mut c_void)
            }
            .map_err(WorkerError::Internal)?;
        }
        self.overlap = Some(ov);
        self.overlap_on = overlap_on;
        Ok(())
    }

    /// Zeroes every gradient (one fill per flat buffer; the views stay in place).
    pub fn zero_grads(&self) {
        for f in &self.flats {
            let mut f = f.shallow_clone();
            let _ = f.zero_();
        }
    }

    /// Called before the last micro-batch's backward of a step: with overlap on, the
    /// hooks learn (first step) or launch each bucket as soon as its gradients are in.
    pub fn begin_last_backward(&self) {
        let Some(ov) = self.overlap.filter(|_| self.overlap_on) else {
            return;
        };
        let mut st = ov.lock();
        match st.expected.clone() {
            None => {
                st.calls.iter_mut().for_each(|c| *c = 0);
                st.mode = Mode::Learn;
            }
            Some(exp) => {
                st.remaining = exp;
                st.next = 0;
                st.mode = Mode::Armed;
            }
        }
    }

    /// After the backward: averages the gradients over all ranks, in place. With overlap,
    /// launches what the hooks have not yet and makes the current stream wait for the
    /// communication stream; else one grouped all-reduce on the current stream.
    pub fn all_reduce_grads(&self) -> Result<(), WorkerError> {
        let ov = self
            .overlap
            .ok_or_else(|| WorkerError::Internal("ddp: gradients were never attached".into()))?;
        {
            let mut st = ov.lock();
            if let Some(e) = st.error.take() {
                return Err(WorkerError::Distributed(e));
            }
            let mode = std::mem::replace(&mut st.mode, Mode::Idle);
            match mode {
                Mode::Armed => {
                    ov.launch_ready(&mut st, true)
                        .map_err(WorkerError::Distributed)?;
                    let cur = self.group.stream()?;
                    // SAFETY: as in `Overlap::launch_ready`.
                    return unsafe { ffi::cuda_stream_wait(cur, ov.stream as *mut c_void) }
                        .map_err(WorkerError::from_device);
                }
                Mode::Learn => {
                    let mut exp = vec![0u32; ov.buckets.len()];
                    for (i, &c) in st.calls.iter().enumerate() {
                        exp[ov.param_bucket[i]] += c;
                    }
                    st.expected = Some(exp);
                }
                Mode::Idle => {}
            }
        }
        let stream = self.group.stream()?;
        let nccl = Arc::clone(&self.group.nccl);
        self.group.with_comm(|c| {
            nccl.group_start()?;
            for b in &ov.buckets {
                let ptr = b.ptr as *mut c_void;
                // SAFETY: the bucket is a live device range of `numel` elements of
                // `dtype`, owned by `self.flats` for the whole run.
                let r = unsafe { c.all_reduce(ptr, ptr, b.numel, b.dtype, RedOp::Avg, stream) };
                if let Err(e) = r {
                    let _ = nccl.group_end();
                    return Err(e);
                }
            }
            nccl.group_end()
        })
    }
}

/// Sum and sum of squares of every parameter, in f64: equal on every rank of a correct
/// data-parallel run; `BENCH_PARAM_CHECKSUM=1` prints it at the end for the GPU tests.
pub fn param_checksum(params: &[Param]) -> (f64, f64) {
    tch::no_grad(|| {
        params.iter().fold((0.0, 0.0), |(s, q), p| {
            let d = p.tensor.to_kind(Kind::Double);
            (
                s + d.sum(Kind::Double).double_value(&[]),
                q + d.square().sum(Kind::Double).double_value(&[]),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    static CALLS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

    unsafe extern "C" fn count(_ctx: *mut c_void, index: i64) {
        let mut c = CALLS.lock().unwrap();
        c[index as usize] += 1;
    }

    /// The mechanism overlap rests on: after a hook is registered on every parameter's
    /// gradient accumulator, each backward calls it once per parameter (a tied weight
    /// included: the engine sums its two gradients before accumulating), also for the
    /// segment-by-segment backward of checkpointing. Runs on CPU: the hooks are plain
    /// autograd.
    #[test]
    fn gradient_hooks_fire_once_per_parameter_and_backward() {
        use crate::workload::models::{self, presets};
        use crate::workload::precision::{Ctx, Precision};
        let cfg = presets::get("gpt2-tiny").unwrap();
        let model = models::build(&cfg, 16, Device::Cpu, Kind::Float);
        let params: Vec<Tensor> = model
            .params()
            .iter()
            .map(|p| p.tensor.shallow_clone())
            .collect();
        *CALLS.lock().unwrap() = vec![0; params.len()];
        // SAFETY: the callback uses only a static; no context pointer.
        unsafe { ffi::grad_ready_hooks(&params, count, std::ptr::null_mut()) }.unwrap();
        let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
        let ctx = Ctx::new(Precision::Fp32);
        model.forward_loss(&ctx, &x, &x).backward();
        assert!(
            CALLS.lock().unwrap().iter().all(|&c| c == 1),
            "{:?}",
            CALLS.lock().unwrap()
        );
        let _ = crate::workload::sac::forward_backward(model.as_ref(), &ctx, &x, &x, 1, 1.0);
        let calls = CALLS.lock().unwrap().clone();
        assert!(calls.iter().all(|&c| c >= 2), "{calls:?}");
    }

    #[test]
    fn checksum_sees_values_and_their_squares() {
        let p = |v: &[f32]| Param {
            name: "p".into(),
            tensor: Tensor::from_slice(v),
            decay: true,
            block: None,
        };
        assert_eq!(param_checksum(&[p(&[1.0, -2.0]), p(&[3.0])]), (2.0, 14.0));
    }
}
