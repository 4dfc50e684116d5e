//! One attempt of a cell as one Slurm job (`--launcher slurm`): the runner's side of
//! [`crate::slurm`].
//!
//! The attempt is submitted with `sbatch`, watched through a [`Queue`] shared by every job
//! in flight (one `squeue` call per poll interval for all of them, not one per job), and
//! its output file is read as it grows: each rank's lines go to that rank's log under
//! `logs/` and through the same [`Collector`](crate::run::executor::Collector) a local
//! attempt uses, so reporters see the same step events and the results hold the same
//! records. The cell's timeout counts from the moment the job leaves the queue (time spent
//! pending is the cluster's, not the cell's); when it passes, or on Ctrl-C, the job is
//! `scancel`led (SIGTERM to its tasks), and killed with SIGKILL if it is still there after
//! the grace period. How the job ended becomes a [`Termination`], judged by the dispatcher
//! as a local attempt's would be.
//!
//! Shaped as the dispatcher is: this file submits the job and hands it to
//! [`job_loop`], where one value holds the job's state and each thing the loop hears of
//! (a queue listing, a failed query, a stop to send) is one small method; [`queue`] shares
//! the `squeue` calls, [`output`] reads the job's output file into logs and events, and
//! [`end`] turns the job's final state into the attempt's record. What an attempt is given
//! and gives back is defined in [`attempt`], and [`call`] runs the blocking Slurm calls off
//! the runtime's thread, so that the loop, the reader and the queue need not import this
//! file.

mod attempt;
mod call;
mod end;
mod job_loop;
mod output;
mod queue;

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::run::executor::{AttemptOutput, Cancel, Termination};

use call::blocking;

pub(crate) use attempt::{JobAttempt, JobNews, JobSpec};
pub(crate) use queue::Queue;

/// How often the queue is asked about the jobs in flight by default.
pub(crate) const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// Environment variable that sets the poll interval in seconds (e.g. `10` on a busy
/// controller).
pub(crate) const ENV_POLL: &str = "BENCH_SLURM_POLL_S";
/// Jobs in flight at once when `--jobs` does not say.
pub(crate) const DEFAULT_JOBS: usize = 32;

/// The poll interval from [`ENV_POLL`], else [`DEFAULT_POLL`].
pub(crate) fn poll_from_env() -> Result<Duration, String> {
    parse_poll(std::env::var(ENV_POLL).ok().as_deref())
}

/// The poll interval a value of [`ENV_POLL`] asks for (unset or empty: the default).
fn parse_poll(v: Option<&str>) -> Result<Duration, String> {
    match v.map(str::trim) {
        Some(t) if !t.is_empty() => t
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| format!("${ENV_POLL}={t:?}: expected a positive number of seconds")),
        _ => Ok(DEFAULT_POLL),
    }
}

/// Runs one attempt as a Slurm job to its end. `pending_only` stops the attempt only while
/// its job has not started (a `--fail-fast` stop withdraws queued jobs, running ones
/// finish); `cancel` stops it in any state (Ctrl-C).
pub(crate) async fn execute<F: FnMut(JobNews<'_>)>(
    spec: JobSpec<'_>,
    queue: &Queue,
    cancel: watch::Receiver<Cancel>,
    pending_only: watch::Receiver<bool>,
    mut news: F,
) -> JobAttempt {
    let started = Instant::now();
    let mut out = AttemptOutput::before_start();
    let mut logs = output::JobLogs::open(spec.log_stem, spec.plan.ranks);
    out.logs = logs.paths.clone();
    if *cancel.borrow() != Cancel::None {
        out.termination = Termination::Cancelled;
        return JobAttempt::without_job(out);
    }
    let plan = spec.plan.clone();
    let submitted = {
        let _turn = queue.submitting.lock().await;
        // Ctrl-C may have come while this attempt waited for its turn.
        if *cancel.borrow() != Cancel::None {
            out.termination = Termination::Cancelled;
            return JobAttempt::without_job(out);
        }
        blocking(move || crate::slurm::submit(&plan)).await
    };
    let job = match submitted {
        Ok(j) => j,
        Err(e) => {
            logs.all(&format!("bench: sbatch failed: {e}"));
            out.termination = Termination::SpawnFailed(format!("sbatch: {e}"));
            out.duration = started.elapsed();
            return JobAttempt::without_job(out);
        }
    };
    queue.watch(&job.id);
    news(JobNews::Submitted(&job.id));
    logs.all(&format!(
        "bench: Slurm job {} ({} task(s) on {} node(s)); its output: {}; script: {}",
        job.id,
        spec.plan.ranks,
        spec.plan.nodes,
        job.output.display(),
        spec.plan.script_path.display()
    ));
    let reader = output::Reader::new(logs, &mut news);
    job_loop::JobLoop::new(
        &spec,
        queue,
        job,
        reader,
        (cancel, pending_only),
        out,
        started,
    )
    .run()
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_intervals_parse() {
        assert_eq!(parse_poll(None), Ok(DEFAULT_POLL));
        assert_eq!(parse_poll(Some(" ")), Ok(DEFAULT_POLL));
        assert_eq!(parse_poll(Some("0.5")), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "soon", "inf", "NaN"] {
            assert!(parse_poll(Some(bad)).is_err(), "{bad}");
        }
    }
}
