//! What each rank of a Slurm job runs: the [`Program`] the job script starts once per task
//! ([`crate::slurm::script`]), and [`free_port`] for a rendezvous on this host.
//!
//! Cells started on this host get their rank contract from the runner's launch plans
//! ([`crate::run::launch::plan`]): one process per GPU with the torchrun variables
//! ([`super::rendezvous::ENV_VARS`]), every rank seeing *all* of the cell's GPUs and picking
//! its own with `LOCAL_RANK`, and NVLink multicast switched off with `NCCL_NVLS_ENABLE=0`.

use std::collections::BTreeMap;
use std::net::TcpListener;
#[cfg(test)]
use std::path::PathBuf;

use crate::cell::Cell;

/// What each rank runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Program {
    /// The built-in workload: `<exe> worker <cell.worker_args()>`, the unit tests'
    /// shorthand (the Slurm launcher passes that argv as a [`Program::Command`]).
    #[cfg(test)]
    Builtin { exe: PathBuf },
    /// A command workload: its argv (placeholders already filled by the caller) and
    /// extra environment.
    Command {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl Program {
    /// The argv (program first) and extra environment for `cell`.
    pub(crate) fn argv_env(
        &self,
        cell: &Cell,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), LaunchError> {
        match self {
            #[cfg(test)]
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

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cell {cell}: the command workload has an empty argv")]
    EmptyCommand { cell: String },
    #[error("no free TCP port for MASTER_PORT: {0}")]
    NoPort(std::io::Error),
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

    #[test]
    fn programs_give_argv_and_env() {
        let mut values = IndexMap::new();
        values.insert("gpus".to_string(), Value::Int(2));
        let c = Cell {
            id: CellId::from_values(&values),
            values,
            params: Params::default(),
        };
        let builtin = Program::Builtin {
            exe: PathBuf::from("/opt/bench"),
        };
        let (argv, env) = builtin.argv_env(&c).unwrap();
        assert_eq!(argv[..2], ["/opt/bench", "worker"]);
        assert_eq!(argv[2..], c.worker_args()[..]);
        assert!(env.is_empty());
        let empty = Program::Command {
            argv: vec![],
            env: BTreeMap::new(),
        };
        assert!(matches!(
            empty.argv_env(&c),
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
