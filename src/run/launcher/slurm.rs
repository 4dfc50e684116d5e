//! The Slurm launcher: one Slurm job per attempt (`--launcher slurm`).
//!
//! This host's GPUs do not count: every cell takes one of `--jobs` slots (32 by default),
//! its attempts run as Slurm jobs ([`crate::run::slurm`] submits and watches them), and
//! Slurm decides where and when; a `--fail-fast` stop also withdraws jobs still queued.
//! Cells run elsewhere ([`Launcher::runs_elsewhere`]): each job's script records its node's
//! environment, which the dispatcher's node-environment policy turns into the run's.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::seam::{AttemptFuture, AttemptIn, AttemptReport, Launcher, News, NewsSink, Placement};
use crate::cell::{Cell, Workload};
use crate::dist::launch::Program;
use crate::run::config::SlurmLaunch;
use crate::run::error::RunError;
use crate::run::launch::{self, AttemptCtx};
use crate::run::slurm::{self as jobs, JobNews, JobSpec, Queue};
use crate::slurm::JobPlan;

use crate::run::slurm::DEFAULT_JOBS;

/// One Slurm job per attempt, all watched through one shared [`Queue`].
pub(crate) struct Slurm {
    launch: SlurmLaunch,
    bench_exe: std::path::PathBuf,
    queue: Arc<Queue>,
}

impl Slurm {
    pub(crate) fn new(launch: SlurmLaunch, bench_exe: std::path::PathBuf) -> Slurm {
        let queue = Queue::new(launch.poll);
        Slurm {
            launch,
            bench_exe,
            queue,
        }
    }
}

/// Under Slurm, the program each task runs: the cell's command line as this host would
/// start it (placeholders filled, the runner's variables set), without device variables
/// (Slurm assigns GPUs) or a rank contract (the job script sets it per task).
fn program(
    cell: &Cell,
    ctx: &AttemptCtx,
    bench_exe: &Path,
) -> Result<Program, launch::LaunchError> {
    let ctx = AttemptCtx {
        visible_devices: None,
        ..ctx.clone()
    };
    let proc_ = launch::command(cell, &ctx, bench_exe)?;
    let mut argv = vec![proc_.program.to_string_lossy().into_owned()];
    argv.extend(proc_.args);
    Ok(Program::Command {
        argv,
        env: proc_.env.into_iter().collect(),
    })
}

/// The Slurm job of one attempt of `cell`, with its script and output in `job_dir`; the
/// script also records its node's environment with `bench_exe env`.
fn plan(
    cell: &Cell,
    ctx: &AttemptCtx,
    bench_exe: &Path,
    sl: &SlurmLaunch,
    job_dir: &Path,
) -> Result<JobPlan, RunError> {
    let program = program(cell, ctx, bench_exe)?;
    crate::slurm::script::plan_with_env_probe(
        cell,
        &program,
        &sl.settings,
        sl.use_gpus,
        job_dir,
        Some(bench_exe),
    )
    .map_err(RunError::Slurm)
}

/// Why a cell cannot run as a Slurm job at all, if it cannot. The submitting host's GPUs
/// do not matter (Slurm decides where a job fits); what matters is that the job's tasks
/// match the cell's ranks: one task per GPU.
pub(crate) fn unschedulable_on_slurm(cell: &Cell, use_gpus: bool) -> Option<String> {
    let need = cell.gpus();
    if cell.params.workload != Workload::Builtin || need <= 1 {
        return None;
    }
    if launch::ranks(cell) == 1 {
        return Some(format!(
            "a built-in `{}` cell is one process, but Slurm starts one task per GPU ({need}); use parallel ddp or fsdp",
            cell.parallel()
        ));
    }
    (!use_gpus).then(|| {
        format!(
            "needs {need} GPUs; the Slurm partition has none (its cells run on CPU, one rank each)"
        )
    })
}

impl Launcher for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn check(&self, cell: &Cell) -> Result<(), RunError> {
        let ctx = AttemptCtx::default();
        launch::plan(cell, &ctx, &self.bench_exe)?;
        // A job that cannot be planned (a bad partition name, ranks that do not split
        // over nodes) is bad input too.
        if self.unschedulable(cell).is_none() {
            plan(cell, &ctx, &self.bench_exe, &self.launch, Path::new("/"))?;
        }
        Ok(())
    }

    fn unschedulable(&self, cell: &Cell) -> Option<String> {
        unschedulable_on_slurm(cell, self.launch.use_gpus)
    }

    fn capacity(&self, jobs: Option<usize>) -> usize {
        jobs.unwrap_or(DEFAULT_JOBS).max(1)
    }

    fn max_running(&self, jobs: Option<usize>) -> Option<usize> {
        Some(jobs.unwrap_or(DEFAULT_JOBS))
    }

    fn need(&self, _cell: &Cell) -> usize {
        1
    }

    fn devices(&self, _slots: &[usize]) -> Vec<String> {
        vec![]
    }

    fn gpu_slots(&self) -> usize {
        0
    }

    fn describe(&self, jobs: Option<usize>) -> Option<String> {
        Some(self.launch.describe(self.max_running(jobs).unwrap_or(1)))
    }

    fn runs_elsewhere(&self) -> bool {
        true
    }

    fn attempt<'a>(&'a self, a: AttemptIn<'a>, news: NewsSink<'a>) -> AttemptFuture<'a> {
        Box::pin(async move {
            // Under Slurm the job script derives the rendezvous port from the job id.
            let ctx = AttemptCtx {
                visible_devices: None,
                repeat: a.repeat,
                attempt: a.attempt,
                run_dir: a.run_dir.to_path_buf(),
                master_port: 0,
                profile: None,
            };
            let job_dir = a.run_dir.join("slurm").join(a.stem);
            let plan = plan(a.cell, &ctx, &self.bench_exe, &self.launch, &job_dir)
                .map_err(|e| e.to_string())?;
            let res = jobs::execute(
                JobSpec {
                    plan,
                    timeout: a.timeout,
                    grace: a.grace,
                    log_stem: &a.log_stem,
                },
                &self.queue,
                a.cancel,
                a.withdraw,
                |n| {
                    news(match n {
                        JobNews::Submitted(job_id) => News::Submitted { job_id },
                        JobNews::Running { job_id, nodes } => News::Running { job_id, nodes },
                        JobNews::Event(ev) => News::Event(ev),
                        JobNews::NodeEnv { job_id, env } => News::NodeEnv { job_id, env },
                        JobNews::AwaitingNodes {
                            job_id,
                            nodes,
                            sign,
                            limit,
                        } => News::AwaitingNodes {
                            job_id,
                            nodes,
                            sign,
                            limit,
                        },
                    })
                },
            )
            .await;
            Ok(AttemptReport {
                out: res.out,
                placement: Placement {
                    job_id: res.job_id,
                    nodes: res.nodes,
                    node_names: res.node_names,
                    node_hardware_key: res.node_env.map(|e| e.hardware_key),
                },
            })
        })
    }

    fn timeout_reason(
        &self,
        repeat: u32,
        timeout_s: u64,
        report: &AttemptReport,
        grace: Duration,
    ) -> String {
        let Some(job) = report.placement.job_id.as_deref() else {
            return super::seam::process_group_timeout(repeat, timeout_s, report, grace);
        };
        format!(
            "repeat {repeat} ran past its {timeout_s}s timeout (counted from the job's start); Slurm job {job} was stopped{}",
            if report.out.escalated {
                format!(
                    " with scancel, and its tasks killed with SIGKILL after the {}s grace period",
                    grace.as_secs_f64()
                )
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::Value;
    use crate::run::launcher::test_cell as cell;

    #[test]
    fn slurm_ignores_this_hosts_gpus_but_not_the_rank_contract() {
        let ddp = |gpus: i64| {
            let mut c = cell(gpus, Workload::Builtin);
            c.values.insert("parallel".into(), Value::Str("ddp".into()));
            c
        };
        // Far more GPUs than any host: Slurm decides where it fits.
        assert!(unschedulable_on_slurm(&ddp(64), true).is_none());
        assert!(unschedulable_on_slurm(&cell(1, Workload::Builtin), false).is_none());
        // A single-process built-in cell cannot be one task per GPU.
        let why = unschedulable_on_slurm(&cell(4, Workload::Builtin), true).unwrap();
        assert!(why.contains("one task per GPU"), "{why}");
        // A CPU partition cannot run multi-rank built-in cells (they need NCCL); command
        // cells decide for themselves.
        assert!(unschedulable_on_slurm(&ddp(2), false).is_some());
        let cmd = Workload::Command {
            argv: vec!["true".into()],
            env: Default::default(),
        };
        assert!(unschedulable_on_slurm(&cell(2, cmd), false).is_none());
    }

    #[test]
    fn slurm_tasks_run_the_cells_command_without_device_variables() {
        let mut c = cell(
            2,
            Workload::Command {
                argv: vec!["train".into(), "--gpus={gpus}".into()],
                env: [("MODE".to_string(), "{gpus}x".to_string())].into(),
            },
        );
        c.params.timeout_s = 30;
        let ctx = AttemptCtx {
            visible_devices: Some(("CUDA_VISIBLE_DEVICES".into(), "0,1".into())),
            repeat: 1,
            attempt: 2,
            run_dir: "/shared/results/r".into(),
            master_port: 0,
            profile: None,
        };
        match program(&c, &ctx, Path::new("/bin/bench")).unwrap() {
            Program::Command { argv, env } => {
                assert_eq!(argv, vec!["train", "--gpus=2"]);
                assert_eq!(env.get("MODE").map(String::as_str), Some("2x"));
                assert_eq!(env.get("BENCH_REPEAT").map(String::as_str), Some("1"));
                assert_eq!(env.get("BENCH_ATTEMPT").map(String::as_str), Some("2"));
                assert_eq!(
                    env.get("BENCH_RUN_DIR").map(String::as_str),
                    Some("/shared/results/r")
                );
                assert!(!env.contains_key("CUDA_VISIBLE_DEVICES"));
            }
            other => panic!("{other:?}"),
        }
    }
}
