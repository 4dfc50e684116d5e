//! Local launch: the process specs of one multi-rank cell on this host.
//!
//! A cell with N ranks becomes N [`ProcSpec`]s, one per GPU, each with the torchrun
//! environment contract ([`super::rendezvous::ENV_VARS`]) and the cell's GPU slots. As
//! torchrun does, every rank sees *all* of the cell's GPUs in `CUDA_VISIBLE_DEVICES` (and
//! `HIP_VISIBLE_DEVICES` for ROCm) and picks its own with `LOCAL_RANK`, so NCCL can find
//! peer GPUs for NVLink/P2P. NVLink multicast (NVLS) is always switched off with
//! `NCCL_NVLS_ENABLE=0`: the lent machines require it and it buys nothing at these sizes.
//!
//! This module only describes processes; the runner spawns them (one process group per
//! cell) and kills the group on failure or timeout.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;

use crate::cell::Cell;

/// What each rank runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Program {
    /// The built-in workload: `<exe> worker <cell.worker_args()>`.
    Builtin { exe: PathBuf },
    /// A command workload: its argv (placeholders already filled by the caller) and
    /// extra environment.
    Command {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl Program {
    /// The built-in workload run by the current executable.
    pub fn current_exe() -> std::io::Result<Program> {
        Ok(Program::Builtin {
            exe: std::env::current_exe()?,
        })
    }

    /// The argv (program first) and extra environment for `cell`.
    pub fn argv_env(
        &self,
        cell: &Cell,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), LaunchError> {
        match self {
            Program::Builtin { exe } => {
                let mut argv = vec![exe.to_string_lossy().into_owned(), "worker".to_string()];
                argv.extend(cell.worker_args());
                Ok((argv, BTreeMap::new()))
            }
            Program::Command { argv, env } => {
                if argv.is_empty() {
                    return Err(LaunchError::EmptyCommand {
                        cell: cell.id.to_string(),
                    });
                }
                Ok((argv.clone(), env.clone()))
            }
        }
    }
}

/// One process of a cell.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcSpec {
    pub rank: u32,
    /// Program and arguments (`argv[0]` is the program).
    pub argv: Vec<String>,
    /// Variables to set on top of the parent's environment.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cell {cell}: needs {ranks} rank(s) but was given {slots} GPU slot(s)")]
    SlotCount {
        cell: String,
        ranks: u32,
        slots: usize,
    },
    #[error("cell {cell}: GPU slot {slot} is given twice")]
    DuplicateSlot { cell: String, slot: u32 },
    #[error("cell {cell}: the command workload has an empty argv")]
    EmptyCommand { cell: String },
    #[error("no free TCP port for MASTER_PORT: {0}")]
    NoPort(std::io::Error),
}

/// The process specs of `cell` on this host.
///
/// `slots` are the GPU indices (as the host numbers them) the scheduler gave the cell:
/// exactly one per rank, or none for a CPU cell, whose ranks then run with no visible GPU.
/// `master_port` comes from [`free_port`] (or a fixed port the caller chose).
pub fn local_specs(
    cell: &Cell,
    program: &Program,
    slots: &[u32],
    master_port: u16,
) -> Result<Vec<ProcSpec>, LaunchError> {
    let ranks = cell.gpus();
    if !slots.is_empty() && slots.len() != ranks as usize {
        return Err(LaunchError::SlotCount {
            cell: cell.id.to_string(),
            ranks,
            slots: slots.len(),
        });
    }
    for (i, s) in slots.iter().enumerate() {
        if slots[..i].contains(s) {
            return Err(LaunchError::DuplicateSlot {
                cell: cell.id.to_string(),
                slot: *s,
            });
        }
    }
    let (argv, extra) = program.argv_env(cell)?;
    let visible = slots
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    Ok((0..ranks)
        .map(|rank| {
            // The cell's own variables first, so the contract below always wins.
            let mut env = extra.clone();
            let contract = super::rendezvous::DistEnv {
                rank,
                world_size: ranks,
                local_rank: rank,
                local_world_size: ranks,
                master_addr: "127.0.0.1".to_string(),
                master_port,
            };
            env.extend(contract.to_env());
            env.insert("CUDA_VISIBLE_DEVICES".into(), visible.clone());
            env.insert("HIP_VISIBLE_DEVICES".into(), visible.clone());
            env.insert("NCCL_NVLS_ENABLE".into(), "0".into());
            ProcSpec {
                rank,
                argv: argv.clone(),
                env,
            }
        })
        .collect())
}

/// A TCP port that is free on this host now (bound to port 0, then released).
///
/// Another process could take it before rank 0 binds it; the rendezvous then fails with
/// a bind error naming the port, which the runner treats as an infrastructure failure
/// and retries.
pub fn free_port() -> Result<u16, LaunchError> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(LaunchError::NoPort)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellId, Params, Value};
    use indexmap::IndexMap;

    fn cell(gpus: i64) -> Cell {
        let mut values = IndexMap::new();
        values.insert("model".to_string(), Value::Str("gpt2-125m".into()));
        values.insert("gpus".to_string(), Value::Int(gpus));
        values.insert("parallel".to_string(), Value::Str("ddp".into()));
        Cell {
            id: CellId::from_values(&values),
            values,
            params: Params::default(),
        }
    }

    #[test]
    fn builtin_cell_gets_one_spec_per_gpu_with_torchrun_env() {
        let c = cell(4);
        let prog = Program::Builtin {
            exe: PathBuf::from("/opt/bench"),
        };
        let specs = local_specs(&c, &prog, &[4, 5, 6, 7], 29511).unwrap();
        assert_eq!(specs.len(), 4);
        for (i, s) in specs.iter().enumerate() {
            assert_eq!(s.rank, i as u32);
            assert_eq!(s.argv[..2], ["/opt/bench", "worker"]);
            assert_eq!(s.argv[2..], c.worker_args()[..]);
            assert_eq!(s.env["RANK"], i.to_string());
            assert_eq!(s.env["LOCAL_RANK"], i.to_string());
            assert_eq!(s.env["WORLD_SIZE"], "4");
            assert_eq!(s.env["LOCAL_WORLD_SIZE"], "4");
            assert_eq!(s.env["MASTER_ADDR"], "127.0.0.1");
            assert_eq!(s.env["MASTER_PORT"], "29511");
            assert_eq!(s.env["CUDA_VISIBLE_DEVICES"], "4,5,6,7");
            assert_eq!(s.env["NCCL_NVLS_ENABLE"], "0");
        }
    }

    #[test]
    fn command_env_cannot_override_the_contract_or_enable_nvls() {
        let c = cell(2);
        let mut env = BTreeMap::new();
        env.insert("NCCL_NVLS_ENABLE".to_string(), "1".to_string());
        env.insert("RANK".to_string(), "9".to_string());
        env.insert("MY_FLAG".to_string(), "a b".to_string());
        let prog = Program::Command {
            argv: vec!["python".into(), "train.py".into()],
            env,
        };
        let specs = local_specs(&c, &prog, &[0, 1], 1234).unwrap();
        assert_eq!(specs[1].argv, ["python", "train.py"]);
        assert_eq!(specs[1].env["RANK"], "1");
        assert_eq!(specs[1].env["NCCL_NVLS_ENABLE"], "0");
        assert_eq!(specs[1].env["MY_FLAG"], "a b");
    }

    #[test]
    fn cpu_cell_has_no_visible_gpu_and_slot_mismatches_are_errors() {
        let c = cell(2);
        let prog = Program::Builtin {
            exe: PathBuf::from("bench"),
        };
        let specs = local_specs(&c, &prog, &[], 1).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].env["CUDA_VISIBLE_DEVICES"], "");
        let e = local_specs(&c, &prog, &[0], 1).unwrap_err();
        assert!(
            e.to_string().contains("needs 2 rank(s) but was given 1"),
            "{e}"
        );
        let e = local_specs(&c, &prog, &[3, 3], 1).unwrap_err();
        assert!(
            matches!(e, LaunchError::DuplicateSlot { slot: 3, .. }),
            "{e}"
        );
        let empty = Program::Command {
            argv: vec![],
            env: BTreeMap::new(),
        };
        assert!(matches!(
            local_specs(&c, &empty, &[0, 1], 1),
            Err(LaunchError::EmptyCommand { .. })
        ));
    }

    #[test]
    fn free_port_is_bindable() {
        let p = free_port().unwrap();
        assert_ne!(p, 0);
        TcpListener::bind(("127.0.0.1", p)).unwrap();
    }
}
