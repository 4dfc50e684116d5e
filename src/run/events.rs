//! Runner events: what the dispatcher tells reporters while a run goes on.
//!
//! The runner emits these and never looks at who listens; reporters (the progress bar,
//! plain lines) consume them and never drive the run, as in cargo-nextest's reporter.

use std::path::PathBuf;

use crate::cell::CellId;
use crate::results::Outcome;

/// What identifies the run a saved cell belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct RunHeader {
    pub run_id: String,
    pub started_at: String,
    pub matrix_name: String,
    pub environment: crate::results::Environment,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    RunStarted {
        run_id: String,
        run_dir: PathBuf,
        /// Cells in the expansion (not counting dropped ones).
        total: usize,
        /// Cells already finished in the run being resumed.
        resumed: usize,
        /// GPU slots of this host (0 on a CPU host, where cells run one at a time).
        gpu_slots: usize,
        /// Under `--launcher slurm`: where the jobs go and how many may be in flight, e.g.
        /// `partition gpu, up to 32 jobs at once` (GPU slots of this host do not apply).
        slurm: Option<String>,
    },
    CellStarted {
        id: CellId,
        /// The device ids the cell owns (empty on a CPU host).
        devices: Vec<String>,
    },
    AttemptStarted {
        id: CellId,
        repeat: u32,
        repeats: u32,
        attempt: u32,
    },
    /// An attempt was submitted as a Slurm job (`--launcher slurm`).
    JobSubmitted {
        id: CellId,
        repeat: u32,
        attempt: u32,
        job_id: String,
    },
    /// A submitted job left the queue and runs on `nodes`.
    JobRunning {
        id: CellId,
        job_id: String,
        nodes: String,
    },
    /// A job failed as a lost peer makes jobs fail (`sign`): the runner asks Slurm about
    /// its `nodes` for up to `limit_s` seconds before judging the attempt, so that a node
    /// Slurm declares lost meanwhile makes it the cluster's failure.
    JobAwaitingNodes {
        id: CellId,
        job_id: String,
        nodes: String,
        sign: String,
        limit_s: u64,
    },
    Step {
        id: CellId,
        repeat: u32,
        step: u64,
        steps: u32,
        step_time_s: f64,
    },
    /// An attempt failed; `retrying` says whether another attempt follows.
    AttemptFailed {
        id: CellId,
        repeat: u32,
        attempt: u32,
        reason: String,
        retrying: bool,
    },
    CellFinished {
        id: CellId,
        outcome: Outcome,
        flaky: bool,
        duration_s: f64,
        /// Median tokens/s of the cell, when measured.
        tokens_per_s: Option<f64>,
        /// True for cells kept from the run being resumed (not run again).
        resumed: bool,
    },
    /// A finished cell is in `results.json` now (emitted after it was written), with the
    /// run's identity: what a consumer that keeps every cell as it finishes (the history
    /// store) needs. Kept cells of a resumed run are announced too.
    CellSaved {
        run: Box<RunHeader>,
        result: Box<crate::results::CellResult>,
    },
    /// No new cell starts from here on (Ctrl-C, --fail-fast, --max-fail).
    Stopping { reason: String },
    /// The run's environment (and hardware key) is now that of a Slurm job's node
    /// (`--launcher slurm`), instead of the submitting host's.
    EnvironmentAdopted {
        hardware_key: String,
        host: String,
        job_id: String,
    },
    /// Something the user must know about the run's results that is not a cell's outcome
    /// (e.g. cells measured on different hardware).
    Warning { message: String },
    RunFinished {
        passed: usize,
        failed: usize,
        skipped: usize,
        interrupted: bool,
        duration_s: f64,
    },
}
