//! One rank's place in a multi-GPU world: the rendezvous ([`crate::dist::rendezvous`]), the
//! NCCL communicator and the small collectives every data-parallel strategy needs (rank
//! 0's parameters broadcast, the step's mean loss, the slowest rank's step time, every
//! rank's peak memory). DDP and FSDP ([`super::dp`]) build on it.
//!
//! A peer's failure reaches this rank through the rendezvous' watcher thread, which aborts
//! the communicator (`ncclCommAbort`) and exits with `exit::worker::DISTRIBUTED`, so no
//! rank is left spinning in a collective; this rank's own failure is reported to the
//! others by [`Group::report_failure`] (or by its socket closing when it dies).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use super::error::WorkerError;
use super::ffi;
use super::models::Param;
use crate::dist::nccl::{Comm, DataType, Nccl, RedOp};
use crate::dist::rendezvous::{Config, DistEnv, Rendezvous};

/// How long rank 0 waits at the end for the others to finish.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) fn dist_err(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Distributed(e.to_string())
}

/// NCCL's name for a tensor dtype.
pub(crate) fn nccl_dtype(kind: Kind) -> Option<DataType> {
    Some(match kind {
        Kind::Float => DataType::Float32,
        Kind::BFloat16 => DataType::Bfloat16,
        Kind::Half => DataType::Float16,
        Kind::Double => DataType::Float64,
        Kind::Int64 => DataType::Int64,
        _ => return None,
    })
}

/// This rank's place in the world and its communicator.
pub(crate) struct Group {
    pub env: DistEnv,
    pub(crate) nccl: Arc<Nccl>,
    /// Shared with the rendezvous' failure hook, which takes and aborts it.
    pub(crate) comm: Arc<Mutex<Option<Comm>>>,
    rv: Option<Rendezvous>,
    pub device: Device,
    pub index: i64,
}

impl Group {
    /// Joins the rendezvous and the NCCL communicator on CUDA device `index`.
    pub(crate) fn join(env: DistEnv, index: i64) -> Result<Group, WorkerError> {
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
        Ok(Group {
            env,
            nccl,
            comm,
            rv: Some(rv),
            device: Device::Cuda(index as usize),
            index,
        })
    }

    pub(crate) fn rank(&self) -> u32 {
        self.env.rank
    }

    pub(crate) fn world_size(&self) -> u32 {
        self.env.world_size
    }

    pub(crate) fn stream(&self) -> Result<*mut c_void, WorkerError> {
        ffi::cuda_current_stream(self.index).map_err(WorkerError::Internal)
    }

    /// Runs `f` with the communicator (an error once a failure hook has aborted it).
    pub(crate) fn with_comm<T>(
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

    /// Broadcasts rank 0's parameters to every rank (in place) and waits for it.
    pub(crate) fn broadcast_params(&self, params: &[Param]) -> Result<(), WorkerError> {
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
        ffi::cuda_synchronize(self.index).map_err(WorkerError::from_device)
    }

    /// An all-reduce of a small device tensor (in place on a copy, which is returned).
    fn reduce_tensor(&self, t: &Tensor, op: RedOp) -> Result<Tensor, WorkerError> {
        let out = t.to_device(self.device).contiguous().copy();
        let dt = nccl_dtype(out.kind())
            .ok_or_else(|| WorkerError::Internal(format!("cannot reduce {:?}", out.kind())))?;
        let stream = self.stream()?;
        let ptr = out.data_ptr();
        // SAFETY: `out` is a live device tensor of `numel` elements of `dt`; it is returned
        // to the caller, who reads it only through libtorch, which orders the read after
        // the work queued on the current stream.
        self.with_comm(|c| unsafe { c.all_reduce(ptr, ptr, out.numel(), dt, op, stream) })?;
        Ok(out)
    }

    /// The mean of a device scalar over all ranks (the step's global loss).
    pub(crate) fn mean(&self, t: &Tensor) -> Result<Tensor, WorkerError> {
        self.reduce_tensor(&t.to_kind(Kind::Float), RedOp::Avg)
    }

    /// The element-wise sum of a small device tensor over all ranks.
    pub(crate) fn sum(&self, t: &Tensor) -> Result<Tensor, WorkerError> {
        self.reduce_tensor(t, RedOp::Sum)
    }

    /// The largest of every rank's `x` (the slowest rank's step time).
    pub(crate) fn max_f64(&self, x: f64) -> Result<f64, WorkerError> {
        let t = self.reduce_tensor(&Tensor::from_slice(&[x]), RedOp::Max)?;
        t.f_double_value(&[0])
            .map_err(|e| WorkerError::from_device(e.to_string()))
    }

    /// Every rank's `x`, in rank order (one all-gather).
    pub(crate) fn gather_u64(&self, x: u64) -> Result<Vec<u64>, WorkerError> {
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
    pub(crate) fn report_failure(&self, message: &str) {
        if let Some(rv) = &self.rv {
            rv.report_failure(message);
        }
    }

    /// Orderly end: waits for queued work, destroys the communicator and closes the
    /// rendezvous (rank 0 waits for the others to be done).
    pub(crate) fn finish(mut self) -> Result<(), WorkerError> {
        ffi::cuda_synchronize(self.index).map_err(WorkerError::from_device)?;
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
}
