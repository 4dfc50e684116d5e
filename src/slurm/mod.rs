//! `--launcher slurm`: each cell runs as one Slurm job (sbatch, srun one task per GPU).
//!
//! [`Settings::resolve`] merges the matrix's `slurm:` block with the environment and the
//! flags; [`script::plan`] renders the job of a cell; [`job::submit`] submits it, and the
//! returned [`job::SlurmJob`] is asked for its state, cancelled or killed; [`job::list`]
//! lists many jobs in one `squeue` call, and [`job::JobOutput`] splits the output file's
//! lines by rank; [`job::lost_nodes`] says which nodes Slurm holds lost, and
//! [`job::node_timeouts`] how long its controller takes to declare a silent node lost;
//! [`hostlist`] expands a node list into names. The runner (`run::slurm`) drives these
//! calls: its job loop decides when, with the timeout and Ctrl-C; this module never
//! decides what a result means.
//!
//! This file is the facade: [`Settings`] lives in `settings` and [`SlurmError`] in `error`,
//! apart from the script and the job calls that use them, and both are re-exported here.

mod error;
pub(crate) mod hostlist;
pub mod job;
pub mod script;
mod settings;

pub use error::SlurmError;
pub(crate) use job::{submit, JobState, SlurmJob};
pub(crate) use script::JobPlan;
pub use settings::Settings;

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
}
