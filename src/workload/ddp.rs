//! Data-parallel training (DDP) of the built-in workload: one process per GPU, joined
//! through the rendezvous ([`crate::dist::rendezvous`]) into one NCCL communicator.
//!
//! Rank 0's initial parameters are broadcast to every rank. Every parameter's gradient is
//! a view of one flat, preallocated buffer per dtype (a "bucket"), so the backward
//! accumulates straight into it and one `ncclAllReduce(avg)` per bucket, queued on the
//! current CUDA stream after the backward's kernels, averages the gradients of all ranks
//! with no flatten or unflatten copies. The all-reduce runs after the backward (no
//! overlap yet).
//!
//! A peer's failure reaches this rank through the rendezvous' watcher thread, which aborts
//! the communicator (`ncclCommAbort`) and exits with `events::exit::DISTRIBUTED`, so no
//! rank is left spinning in a collective; this rank's own failure is reported to the
//! others by [`Ddp::report_failure`] (or by its socket closing when it dies).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use super::ffi;
use super::models::Param;
use super::WorkerError;
use crate::dist::nccl::{Comm, DataType, Nccl, RedOp};
use crate::dist::rendezvous::{Config, DistEnv, Rendezvous};

/// How long rank 0 waits at the end for the others to finish.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);

fn dist_err(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Distributed(e.to_string())
}

/// NCCL's name for a tensor dtype.
pub fn nccl_dtype(kind: Kind) -> Option<DataType> {
    Some(match kind {
        Kind::Float => DataType::Float32,
        Kind::BFloat16 => DataType::Bfloat16,
        Kind::Half => DataType::Float16,
        Kind::Double => DataType::Float64,
        Kind::Int64 => DataType::Int64,
        _ => return None,
    })
}

/// One flat gradient buffer holding the gradients of every parameter of one dtype.
struct Bucket {
    flat: Tensor,
    dtype: DataType,
    numel: usize,
}

/// This rank's place in the world and its communicator.
pub struct Ddp {
    pub env: DistEnv,
    nccl: Arc<Nccl>,
    /// Shared with the rendezvous' failure hook, which takes and aborts it.
    comm: Arc<Mutex<Option<Comm>>>,
    rv: Option<Rendezvous>,
    device: Device,
    index: i64,
    buckets: Vec<Bucket>,
}

impl Ddp {
    /// Joins the rendezvous and the NCCL communicator on CUDA device `index`.
    pub fn join(env: DistEnv, index: i64) -> Result<Ddp, WorkerError> {
        ffi::cuda_set_device(index).map_err(WorkerError::Internal)?;
        let nccl = Nccl::load(None).map_err(dist_err)?;
        let config = Config::from_env().map_err(dist_err)?;
        let (rv, id) = crate::dist::join_with_nccl(&env, &nccl, config).map_err(dist_err)?;
        let comm = nccl
            .comm_init_rank(env.world_size, &id, env.rank)
            .map_err(dist_err)?;
        let comm = Arc::new(Mutex::new(Some(comm)));
        let hook_comm = Arc::clone(&comm);
        rv.set_failure_hook(Box::new(move |_| {
            // The main thread holds the lock only while queueing a collective, which does
            // not block; a few tries are enough, and the process exits right after anyway.
            for _ in 0..100 {
                if let Ok(mut g) = hook_comm.try_lock() {
                    if let Some(c) = g.take() {
                        let _ = c.abort();
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }));
        Ok(Ddp {
            env,
            nccl,
            comm,
            rv: Some(rv),
            device: Device::Cuda(index as usize),
            index,
            buckets: Vec::new(),
        })
    }

    pub fn rank(&self) -> u32 {
        self.env.rank
    }

    pub fn world_size(&self) -> u32 {
        self.env.world_size
    }

    fn stream(&self) -> Result<*mut c_void, WorkerError> {
        ffi::cuda_current_stream(self.index).map_err(WorkerError::Internal)
    }

    /// Runs `f` with the communicator (an error once a failure hook has aborted it).
    fn with_comm<T>(
        &self,
        f: impl FnOnce(&Comm) -> Result<T, crate::dist::nccl::NcclError>,
    ) -> Result<T, WorkerError> {
        let g = self
            .comm
            .lock()
            .map_err(|_| WorkerError::Distributed("communicator lock poisoned".into()))?;
        let comm = g
            .as_ref()
            .ok_or_else(|| WorkerError::Distributed("communicator aborted".into()))?;
        f(comm).map_err(dist_err)
    }

    /// Broadcasts rank 0's parameters to every rank, then points every parameter's
    /// gradient at its slice of a flat bucket of its dtype.
    pub fn attach(&mut self, params: &[Param]) -> Result<(), WorkerError> {
        let stream = self.stream()?;
        let nccl = Arc::clone(&self.nccl);
        self.with_comm(|c| {
            nccl.group_start()?;
            for p in params {
                let t = &p.tensor;
                let Some(dt) = nccl_dtype(t.kind()) else {
                    continue;
                };
                // SAFETY: a live, contiguous device tensor of `numel` elements of `dt`,
                // kept alive by `params` until the stream is synchronised below.
                let r =
                    unsafe { c.broadcast(t.data_ptr(), t.data_ptr(), t.numel(), dt, 0, stream) };
                if let Err(e) = r {
                    let _ = nccl.group_end();
                    return Err(e);
                }
            }
            nccl.group_end()
        })?;
        ffi::cuda_synchronize(self.index).map_err(WorkerError::from_device)?;

        let mut by_kind: BTreeMap<i32, Vec<&Param>> = BTreeMap::new();
        for p in params {
            if !p.tensor.is_contiguous() {
                return Err(WorkerError::Internal(format!(
                    "ddp: parameter {} is not contiguous",
                    p.name
                )));
            }
            by_kind
                .entry(nccl_dtype(p.tensor.kind()).map_or(-1, |d| d as i32))
                .or_default()
                .push(p);
        }
        for ps in by_kind.values() {
            let kind = ps[0].tensor.kind();
            let dtype = nccl_dtype(kind).ok_or_else(|| {
                WorkerError::Unsupported(format!(
                    "ddp: parameter {} has dtype {kind:?}, which NCCL cannot reduce",
                    ps[0].name
                ))
            })?;
            let numel: usize = ps.iter().map(|p| p.tensor.numel()).sum();
            let flat = Tensor::zeros([numel as i64], (kind, self.device));
            let mut off = 0i64;
            for p in ps {
                let n = p.tensor.numel() as i64;
                let view = flat.narrow(0, off, n).view(p.tensor.size().as_slice());
                let mut t = p.tensor.shallow_clone();
                ffi::set_grad(&mut t, &view).map_err(WorkerError::Internal)?;
                off += n;
            }
            self.buckets.push(Bucket { flat, dtype, numel });
        }
        Ok(())
    }

    /// Zeroes every gradient (one fill per bucket; the views stay in place).
    pub fn zero_grads(&self) {
        for b in &self.buckets {
            let mut f = b.flat.shallow_clone();
            let _ = f.zero_();
        }
    }

    /// Averages the gradients over all ranks, in place, on the current stream.
    pub fn all_reduce_grads(&self) -> Result<(), WorkerError> {
        let stream = self.stream()?;
        let nccl = Arc::clone(&self.nccl);
        self.with_comm(|c| {
            nccl.group_start()?;
            for b in &self.buckets {
                let ptr = b.flat.data_ptr();
                // SAFETY: the bucket is a live device buffer of `numel` elements of
                // `dtype`, owned by `self` for the whole run.
                let r = unsafe { c.all_reduce(ptr, ptr, b.numel, b.dtype, RedOp::Avg, stream) };
                if let Err(e) = r {
                    let _ = nccl.group_end();
                    return Err(e);
                }
            }
            nccl.group_end()
        })
    }

    /// An all-reduce of a small device tensor (in place on a copy, which is returned).
    fn reduce_tensor(&self, t: &Tensor, op: RedOp) -> Result<Tensor, WorkerError> {
        let out = t.to_device(self.device).contiguous().copy();
        let dt = nccl_dtype(out.kind())
            .ok_or_else(|| WorkerError::Internal(format!("ddp: cannot reduce {:?}", out.kind())))?;
        let stream = self.stream()?;
        let ptr = out.data_ptr();
        // SAFETY: `out` is a live device tensor of `numel` elements of `dt`; it is returned
        // to the caller, who reads it only through libtorch, which orders the read after
        // the work queued on the current stream.
        self.with_comm(|c| unsafe { c.all_reduce(ptr, ptr, out.numel(), dt, op, stream) })?;
        Ok(out)
    }

    /// The mean of a device scalar over all ranks (the step's global loss).
    pub fn mean(&self, t: &Tensor) -> Result<Tensor, WorkerError> {
        self.reduce_tensor(&t.to_kind(Kind::Float), RedOp::Avg)
    }

    /// The largest of every rank's `x` (the slowest rank's step time).
    pub fn max_f64(&self, x: f64) -> Result<f64, WorkerError> {
        let t = self.reduce_tensor(&Tensor::from_slice(&[x]), RedOp::Max)?;
        t.f_double_value(&[0])
            .map_err(|e| WorkerError::from_device(e.to_string()))
    }

    /// Every rank's `x`, in rank order (one all-gather).
    pub fn gather_u64(&self, x: u64) -> Result<Vec<u64>, WorkerError> {
        let send = Tensor::from_slice(&[x as i64]).to_device(self.device);
        let recv = Tensor::zeros([self.world_size() as i64], (Kind::Int64, self.device));
        let stream = self.stream()?;
        // SAFETY: `send` holds 1 and `recv` world_size int64 elements on this device, both
        // alive until the copy to the host below, which libtorch orders after the stream.
        self.with_comm(|c| unsafe {
            c.all_gather(send.data_ptr(), recv.data_ptr(), 1, DataType::Int64, stream)
        })?;
        let host = recv.to_device(Device::Cpu);
        let v = Vec::<i64>::try_from(&host).map_err(|e| WorkerError::from_device(e.to_string()))?;
        Ok(v.into_iter().map(|b| b.max(0) as u64).collect())
    }

    /// Tells the other ranks that this one failed, so they stop at once.
    pub fn report_failure(&self, message: &str) {
        if let Some(rv) = &self.rv {
            rv.report_failure(message);
        }
    }

    /// Orderly end: waits for queued work, destroys the communicator and closes the
    /// rendezvous (rank 0 waits for the others to be done).
    pub fn finish(mut self) -> Result<(), WorkerError> {
        ffi::cuda_synchronize(self.index).map_err(WorkerError::from_device)?;
        self.buckets.clear();
        let comm = self.comm.lock().ok().and_then(|mut g| g.take());
        if let Some(c) = comm {
            c.destroy().map_err(dist_err)?;
        }
        if let Some(rv) = self.rv.take() {
            rv.finish(FINISH_TIMEOUT).map_err(dist_err)?;
        }
        Ok(())
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

    #[test]
    fn dtypes_map_to_nccl() {
        assert_eq!(nccl_dtype(Kind::Float), Some(DataType::Float32));
        assert_eq!(nccl_dtype(Kind::BFloat16), Some(DataType::Bfloat16));
        assert_eq!(nccl_dtype(Kind::Int64), Some(DataType::Int64));
        assert_eq!(nccl_dtype(Kind::Bool), None);
    }

    #[test]
    fn checksum_sees_values_and_their_squares() {
        let p = |v: &[f32]| Param {
            name: "p".into(),
            tensor: Tensor::from_slice(v),
            decay: true,
        };
        assert_eq!(param_checksum(&[p(&[1.0, -2.0]), p(&[3.0])]), (2.0, 14.0));
    }
}
