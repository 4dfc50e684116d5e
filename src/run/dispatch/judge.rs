//! Judging an attempt: how its end (exit code, signal, timeout, progress) becomes a
//! [`Verdict`], and what a verdict means for the cell.
//!
//! Retries are only for infrastructure failures (spawn failure, death by a signal the
//! runner did not send, a crash before the first step event); a success after a retry
//! marks the cell flaky. Worker exit 3 (unsupported) skips the cell; 2 (bad input), 4 (out
//! of memory) and 5 (NaN loss) fail it without retry (the codes are [`crate::exit::worker`]).

use crate::events::ErrorKind;
use crate::results::Outcome;
use crate::run::executor::{AttemptOutput, Termination};

/// How one attempt is judged.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Ok,
    /// Retried while retries remain.
    Infra(String),
    Failed(String),
    Unsupported(String),
    TimedOut,
    Cancelled,
    /// A queued Slurm job withdrawn by a `--fail-fast`/`--max-fail` stop.
    Withdrawn,
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// The worker's own words about a failure: its `error` event, else its last log line.
fn detail(o: &AttemptOutput) -> String {
    if let Some((_, msg)) = &o.error {
        return msg.clone();
    }
    o.tail
        .last()
        .cloned()
        .unwrap_or_else(|| "no output".to_string())
}

pub(crate) fn judge(o: &AttemptOutput) -> Verdict {
    use crate::exit::worker as exit;
    match &o.termination {
        Termination::SpawnFailed(msg) => Verdict::Infra(msg.clone()),
        Termination::Lost(msg) => Verdict::Infra(msg.clone()),
        Termination::TimedOut => Verdict::TimedOut,
        Termination::Cancelled => Verdict::Cancelled,
        Termination::Withdrawn => Verdict::Withdrawn,
        Termination::Signaled(s) => Verdict::Infra(format!(
            "killed by {} after {} step event(s): {}",
            signal_name(*s),
            o.steps.len(),
            detail(o)
        )),
        Termination::Exited(0) => {
            // An `error` event (or output that broke the event contract) fails the attempt
            // even when the process exits 0.
            if let Some((_, msg)) = &o.error {
                Verdict::Failed(msg.clone())
            } else if o.steps.is_empty() && o.summary.is_none() {
                Verdict::Failed(
                    "exited 0 without printing any step or summary event (see its log)".into(),
                )
            } else {
                Verdict::Ok
            }
        }
        Termination::Exited(exit::UNSUPPORTED) => Verdict::Unsupported(detail(o)),
        Termination::Exited(c @ (exit::BAD_INPUT | exit::OOM | exit::NAN_LOSS)) => {
            let what = match *c {
                exit::BAD_INPUT => ErrorKind::BadInput,
                exit::OOM => ErrorKind::Oom,
                _ => ErrorKind::NanLoss,
            };
            let label = match what {
                ErrorKind::BadInput => "bad input",
                ErrorKind::Oom => "out of memory",
                _ => "loss became NaN",
            };
            Verdict::Failed(format!("{label} (exit {c}): {}", detail(o)))
        }
        Termination::Exited(c) if o.steps.is_empty() => Verdict::Infra(format!(
            "crashed with exit code {c} before its first step: {}",
            detail(o)
        )),
        Termination::Exited(c) => Verdict::Failed(format!(
            "exited with code {c} after {} step event(s): {}",
            o.steps.len(),
            detail(o)
        )),
    }
}

impl Verdict {
    /// The attempt's error as results record it; `None` for a good attempt.
    pub(crate) fn error(&self, timeout_s: u64) -> Option<String> {
        match self {
            Verdict::Ok => None,
            Verdict::Infra(m) | Verdict::Failed(m) | Verdict::Unsupported(m) => Some(m.clone()),
            Verdict::TimedOut => Some(format!("timed out after {timeout_s}s")),
            Verdict::Cancelled => Some("interrupted".into()),
            Verdict::Withdrawn => Some("withdrawn from the Slurm queue".into()),
        }
    }

    /// Whether a failed attempt is reported as it happens. A skip (unsupported) or a stop
    /// on request is said once, by the cell's outcome.
    pub(crate) fn is_noteworthy(&self) -> bool {
        !matches!(
            self,
            Verdict::Cancelled | Verdict::Unsupported(_) | Verdict::Withdrawn
        )
    }

    /// The cell's outcome after its last attempt (number `attempt`, 0-based) ended with
    /// this verdict. A timeout's words depend on the launcher, so the caller says them.
    pub(crate) fn outcome(self, attempt: u32) -> Outcome {
        match self {
            Verdict::Ok => Outcome::Passed,
            Verdict::Infra(m) => Outcome::Failed {
                reason: format!("infrastructure failure in {} attempt(s): {m}", attempt + 1),
            },
            Verdict::Failed(m) => Outcome::Failed { reason: m },
            Verdict::Unsupported(m) => Outcome::Skipped {
                reason: format!("unsupported here: {m}"),
            },
            Verdict::TimedOut => Outcome::TimedOut {
                reason: "ran past its timeout".into(),
            },
            Verdict::Cancelled => Outcome::Skipped {
                reason: "the run was interrupted while this cell ran".into(),
            },
            Verdict::Withdrawn => Outcome::Skipped {
                reason: "not run: its Slurm job was withdrawn from the queue before it started, because the run stopped starting cells".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn output(t: Termination, steps: usize) -> AttemptOutput {
        AttemptOutput {
            termination: t,
            steps: (0..steps)
                .map(|i| crate::events::StepEvent {
                    step: i as u64,
                    step_time_s: 0.1,
                    tokens: 1,
                    loss: 1.0,
                    warmup: None,
                    rank: None,
                })
                .collect(),
            summary: None,
            notices: vec![],
            error: None,
            tail: vec!["last words".into()],
            duration: Duration::ZERO,
            escalated: false,
            logs: vec![],
        }
    }

    #[test]
    fn attempts_are_judged_by_exit_code_and_progress() {
        use Termination::*;
        assert_eq!(judge(&output(Exited(0), 3)), Verdict::Ok);
        assert!(matches!(judge(&output(Exited(0), 0)), Verdict::Failed(_)));
        assert_eq!(
            judge(&output(Exited(3), 0)),
            Verdict::Unsupported("last words".into())
        );
        for c in [2, 4, 5] {
            assert!(
                matches!(judge(&output(Exited(c), 0)), Verdict::Failed(_)),
                "{c}"
            );
        }
        // A crash before any step is infrastructure (retried); after steps it is the cell's.
        assert!(matches!(judge(&output(Exited(1), 0)), Verdict::Infra(_)));
        assert!(matches!(judge(&output(Exited(1), 2)), Verdict::Failed(_)));
        assert!(matches!(judge(&output(Signaled(9), 2)), Verdict::Infra(_)));
        assert!(matches!(
            judge(&output(SpawnFailed("x".into()), 0)),
            Verdict::Infra(_)
        ));
        assert_eq!(judge(&output(TimedOut, 1)), Verdict::TimedOut);
        assert!(matches!(
            judge(&output(Lost("NODE_FAIL".into()), 2)),
            Verdict::Infra(_)
        ));
        assert_eq!(judge(&output(Withdrawn, 0)), Verdict::Withdrawn);
    }
}
