//! Multi-rank execution: NCCL/RCCL loaded at run time ([`nccl`]), the rendezvous on
//! torchrun's environment contract that shares the NCCL unique id and spreads failures
//! ([`rendezvous`]), and the process specs of a cell's ranks on one host ([`launch`]).
//! The Slurm launcher lives in [`crate::slurm`]; the DDP/FSDP trainer in
//! [`crate::workload`] builds on these.

pub mod launch;
// The worker side of these (communicators, the rendezvous a rank joins) serves the
// built-in workload; the runner-only build keeps them for their types and tests.
#[cfg_attr(not(feature = "builtin"), allow(dead_code))]
pub mod nccl;
#[cfg_attr(not(feature = "builtin"), allow(dead_code))]
pub mod rendezvous;

use std::sync::Arc;

use nccl::{Nccl, NcclError, UniqueId};
use rendezvous::{Config, DistEnv, Rendezvous, RendezvousError};

/// Failures of setting up a multi-rank worker.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error(transparent)]
    Nccl(#[from] NcclError),
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
}

/// Joins the world and shares rank 0's NCCL unique id: what every rank of a DDP/FSDP
/// worker calls before `Nccl::comm_init_rank(env.world_size, &id, env.rank)`.
pub fn join_with_nccl(
    env: &DistEnv,
    nccl: &Arc<Nccl>,
    config: Config,
) -> Result<(Rendezvous, UniqueId), DistError> {
    let (rv, bytes) = rendezvous::join(env, config, || {
        nccl.unique_id()
            .map(|id| id.as_bytes().to_vec())
            .map_err(|e| e.to_string())
    })?;
    Ok((rv, UniqueId::from_bytes(&bytes)?))
}
