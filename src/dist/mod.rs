//! Multi-rank execution: NCCL/RCCL loaded at run time ([`nccl`]), the rendezvous on
//! torchrun's environment contract that shares the NCCL unique id and spreads failures
//! ([`rendezvous`]), and the process specs of a cell's ranks on one host ([`launch`]).
//! The Slurm launcher lives in [`crate::slurm`]; the DDP/FSDP trainer in
//! [`crate::workload`] builds on these.

pub mod launch;
pub mod nccl;
pub mod rendezvous;
