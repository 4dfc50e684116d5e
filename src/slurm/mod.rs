//! `--launcher slurm`: each cell runs as one Slurm job (sbatch, srun one task per GPU).
//!
//! [`Settings::resolve`] merges the matrix's `slurm:` block with the environment and the
//! flags; [`script::plan`] renders the job of a cell; [`job::submit`] submits it, and the
//! returned [`job::SlurmJob`] is asked for its state, cancelled or killed; [`job::list`]
//! lists many jobs in one `squeue` call, and [`job::JobOutput`] splits the output file's
//! lines by rank. The runner (`run::slurm`) drives these calls: its job loop decides when,
//! with the timeout and Ctrl-C; this module never decides what a result means.

pub mod job;
pub mod script;

use crate::matrix::spec::SlurmSpec;

pub(crate) use job::{submit, JobState, SlurmJob};
pub(crate) use script::JobPlan;

/// Environment variable overriding the matrix's partition (a flag overrides both).
pub(crate) const ENV_PARTITION: &str = "BENCH_SLURM_PARTITION";
/// Environment variable overriding the matrix's account (a flag overrides both).
pub(crate) const ENV_ACCOUNT: &str = "BENCH_SLURM_ACCOUNT";
/// GPUs per node when neither the matrix nor anything else says (H100/H200/MI300X nodes).
pub(crate) const DEFAULT_GPUS_PER_NODE: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("{origin}: {what} {value:?} is not a Slurm name (letters, digits, `_ . , + -` only)")]
    BadName {
        origin: String,
        what: &'static str,
        value: String,
    },
    #[error("matrix slurm.time: {0}")]
    BadTime(String),
    #[error("matrix slurm.gpus_per_node: must be at least 1")]
    ZeroGpusPerNode,
    #[error("cell {cell}: {ranks} ranks do not split evenly over nodes of {per_node} GPUs; use a multiple of {per_node} or set slurm.gpus_per_node")]
    UnevenNodes {
        cell: String,
        ranks: u32,
        per_node: u32,
    },
    #[error("cell {cell}: a framework cell runs as one Slurm task on one node (its launcher, e.g. torchrun, starts a process per GPU there), and its {gpus} GPUs exceed the {per_node} a node has (slurm.gpus_per_node)")]
    FrameworkOverNodes {
        cell: String,
        gpus: u32,
        per_node: u32,
    },
    #[error("cell {cell}: environment variable name {name:?} is not an identifier")]
    BadEnvName { cell: String, name: String },
    #[error("a value contains a NUL byte, which no command argument can hold: {value:?}")]
    Nul { value: String },
    #[error("{0}")]
    Launch(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot run `{tool}` ({source}); is the Slurm client installed and on PATH?")]
    Tool {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("sbatch refused cell {cell} (exit {status}): {stderr}")]
    Submit {
        cell: String,
        status: String,
        stderr: String,
    },
    #[error("`{cmd}` failed: {stderr}")]
    Query { cmd: String, stderr: String },
}

impl SlurmError {
    /// True for errors in the user's matrix, flags or environment (exit 2); the rest
    /// are failures of the cluster or of this host.
    pub(crate) fn is_bad_input(&self) -> bool {
        matches!(
            self,
            SlurmError::BadName { .. }
                | SlurmError::BadTime(_)
                | SlurmError::ZeroGpusPerNode
                | SlurmError::UnevenNodes { .. }
                | SlurmError::FrameworkOverNodes { .. }
                | SlurmError::BadEnvName { .. }
                | SlurmError::Nul { .. }
                | SlurmError::Launch(_)
        )
    }
}

impl From<SlurmError> for crate::error::CliError {
    fn from(e: SlurmError) -> Self {
        if e.is_bad_input() {
            crate::error::CliError::bad_input(miette::Report::msg(e.to_string()))
        } else {
            crate::error::CliError::internal(miette::Report::msg(e.to_string()))
        }
    }
}

/// Resolved Slurm settings for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Job time limit; `None` takes each cell's timeout plus a minute.
    pub time_s: Option<u64>,
    pub gpus_per_node: u32,
    /// Extra sbatch options, passed as separate arguments (never through a shell).
    pub sbatch_args: Vec<String>,
}

fn check_name(origin: &str, what: &'static str, v: String) -> Result<String, SlurmError> {
    let ok = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.,+-".contains(c));
    if ok {
        Ok(v)
    } else {
        Err(SlurmError::BadName {
            origin: origin.to_string(),
            what,
            value: v,
        })
    }
}

impl Settings {
    /// Merges, highest first: the flags (`--partition`, `--account`), the environment
    /// (`BENCH_SLURM_PARTITION`, `BENCH_SLURM_ACCOUNT`), the matrix's `slurm:` block.
    /// `env` reads a variable (pass `|k| std::env::var(k).ok()`).
    pub(crate) fn resolve(
        spec: Option<&SlurmSpec>,
        flag_partition: Option<&str>,
        flag_account: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SlurmError> {
        let pick = |flag: Option<&str>,
                    var: &'static str,
                    from_spec: Option<&String>,
                    what: &'static str,
                    key: &str|
         -> Result<Option<String>, SlurmError> {
            if let Some(f) = flag {
                return check_name(&format!("--{what}"), what, f.to_string()).map(Some);
            }
            if let Some(e) = env(var).filter(|e| !e.is_empty()) {
                return check_name(&format!("${var}"), what, e).map(Some);
            }
            from_spec
                .map(|s| check_name(&format!("matrix {key}"), what, s.clone()))
                .transpose()
        };
        let partition = pick(
            flag_partition,
            ENV_PARTITION,
            spec.and_then(|s| s.partition.as_ref()),
            "partition",
            "slurm.partition",
        )?;
        let account = pick(
            flag_account,
            ENV_ACCOUNT,
            spec.and_then(|s| s.account.as_ref()),
            "account",
            "slurm.account",
        )?;
        let time_s = spec
            .and_then(|s| s.time.as_ref())
            .map(|t| t.seconds().map_err(SlurmError::BadTime))
            .transpose()?;
        let gpus_per_node = spec
            .and_then(|s| s.gpus_per_node)
            .unwrap_or(DEFAULT_GPUS_PER_NODE);
        if gpus_per_node == 0 {
            return Err(SlurmError::ZeroGpusPerNode);
        }
        Ok(Settings {
            partition,
            account,
            time_s,
            gpus_per_node,
            sbatch_args: spec.map(|s| s.sbatch_args.clone()).unwrap_or_default(),
        })
    }
}

/// Whether the nodes of `partition` (the default partition when `None`) offer GPUs, from
/// `sinfo -h -o %P|%G` output: a generic resource named `gpu` on any of its nodes.
pub(crate) fn gpus_in_listing(listing: &str, partition: Option<&str>) -> bool {
    let rows: Vec<(&str, &str)> = listing
        .lines()
        .filter_map(|l| l.trim().split_once('|'))
        .collect();
    let chosen: Vec<&(&str, &str)> = match partition {
        Some(p) => rows
            .iter()
            .filter(|(name, _)| name.trim_end_matches('*') == p)
            .collect(),
        None => {
            let default: Vec<_> = rows.iter().filter(|(n, _)| n.ends_with('*')).collect();
            if default.is_empty() {
                rows.iter().collect()
            } else {
                default
            }
        }
    };
    chosen.iter().any(|(_, gres)| {
        gres.split(',')
            .any(|g| g.trim() == "gpu" || g.trim().starts_with("gpu:"))
    })
}

/// Asks `sinfo` whether the partition the jobs go to has GPUs; CPU cells are submitted
/// without `--gpus-per-node` when it has none.
pub(crate) fn partition_has_gpus(partition: Option<&str>) -> Result<bool, SlurmError> {
    let out = job::run_tool(
        crate::proc::Tool::new("sinfo").args(["-h", "-o", "%P|%G"]),
        "sinfo",
    )?;
    if !out.status.success() {
        return Err(SlurmError::Query {
            cmd: "sinfo -h -o %P|%G".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(gpus_in_listing(
        &String::from_utf8_lossy(&out.stdout),
        partition,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_partitions_are_told_from_cpu_ones() {
        let listing =
            "debug*|(null)\ngpu|gpu:h100:8(S:0-1)\ngpu|(null)\nmixed|craynetwork:4,gpu:2\n";
        assert!(!super::gpus_in_listing(listing, None));
        assert!(super::gpus_in_listing(listing, Some("gpu")));
        assert!(super::gpus_in_listing(listing, Some("mixed")));
        assert!(!super::gpus_in_listing(listing, Some("debug")));
        assert!(!super::gpus_in_listing(listing, Some("absent")));
        // No default partition marked: any partition with GPUs counts.
        assert!(super::gpus_in_listing("a|(null)\nb|gpu:1\n", None));
        assert!(!super::gpus_in_listing("a|gpus_fake:1\n", None));
    }

    use super::*;
    use crate::matrix::spec::DurationSpec;

    fn spec() -> SlurmSpec {
        SlurmSpec {
            partition: Some("batch".into()),
            account: Some("proj1".into()),
            time: Some(DurationSpec::Text("1h30m".into())),
            gpus_per_node: Some(4),
            sbatch_args: vec!["--exclusive".into()],
        }
    }

    #[test]
    fn flags_beat_env_beat_matrix() {
        let none = |_: &str| None;
        let s = Settings::resolve(Some(&spec()), None, None, none).unwrap();
        assert_eq!(s.partition.as_deref(), Some("batch"));
        assert_eq!(s.account.as_deref(), Some("proj1"));
        assert_eq!(s.time_s, Some(5400));
        assert_eq!(s.gpus_per_node, 4);
        let env = |k: &str| (k == ENV_PARTITION).then(|| "h200".to_string());
        let s = Settings::resolve(Some(&spec()), None, None, env).unwrap();
        assert_eq!(s.partition.as_deref(), Some("h200"));
        let s = Settings::resolve(Some(&spec()), Some("debug"), Some("acct"), env).unwrap();
        assert_eq!(s.partition.as_deref(), Some("debug"));
        assert_eq!(s.account.as_deref(), Some("acct"));
        let s = Settings::resolve(None, None, None, none).unwrap();
        assert_eq!(
            (s.partition, s.gpus_per_node),
            (None, DEFAULT_GPUS_PER_NODE)
        );
    }

    #[test]
    fn bad_values_name_where_they_came_from() {
        let env = |k: &str| (k == ENV_ACCOUNT).then(|| "a b".to_string());
        let e = Settings::resolve(None, None, None, env).unwrap_err();
        assert!(e.to_string().contains("$BENCH_SLURM_ACCOUNT"), "{e}");
        assert!(e.is_bad_input());
        let mut s = spec();
        s.time = Some(DurationSpec::Text("soon".into()));
        let e = Settings::resolve(Some(&s), None, None, |_| None).unwrap_err();
        assert!(e.to_string().contains("slurm.time"), "{e}");
        let e = Settings::resolve(Some(&spec()), Some("x\ny"), None, |_| None).unwrap_err();
        assert!(e.to_string().contains("--partition"), "{e}");
    }
}
