//! Raw command-line arguments: the clap derive types and nothing else.
//!
//! Nothing here is interpreted. [`super::resolve`] turns these values into each stage's
//! own settings (as ripgrep separates its low-level args from the resolved `HiArgs`), so
//! no module outside `cli` ever sees a clap struct.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::axes::{Device, Dtype, Parallel};
use crate::format::Format;

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    version,
    about = "Declarative LLM-training benchmark matrices as a CI gate",
    after_help = "Exit codes: 0 all good; 1 regressions or failed cells; 2 bad input (matrix, filter, baseline file, arguments); other codes are internal failures."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Expand a matrix and run its cells (or list them with --dry-run).
    Matrix(MatrixArgs),
    /// Print the JSON Schema of matrix files.
    Schema,
    /// Run one cell of the built-in training workload in this process (started by the runner).
    Worker(Box<WorkerArgs>),
    /// Render the reports of a finished run again, or post them to a pull request.
    Report(ReportArgs),
    /// Manage stored baselines.
    Baseline(BaselineArgs),
    /// Print the environment and hardware key of this host.
    Env(EnvArgs),
    /// Run one attempt of a framework cell (torchtitan, hf) and print worker events read
    /// from its log (started by the runner).
    #[command(hide = true)]
    Adapt(AdaptArgs),
    /// Run history: a cell's trend and change points, back-filling, the calibration study.
    History(HistoryArgs),
    /// Find the commit that changed a cell's speed: measure commits between a good and a
    /// bad revision of this git repository (binary search), each probe recorded in the
    /// history.
    #[command(long_about = BISECT_ABOUT)]
    Bisect(BisectArgs),
    /// Judge a run launched elsewhere from its log (NeMo, Paxml, Megatron, MaxText,
    /// torchtitan, llm.c, DeepSpeed): figures, history, verdict (docs/ingest.md).
    Ingest(Box<IngestArgs>),
    /// Write a static site over the whole history store (no server: open it from disk or
    /// publish the folder as a Pages artifact): every cell's trend per hardware key with
    /// change points, verdicts and accepted shifts, the open regressions, a page per run.
    Site(SiteArgs),
    /// Print a shell completion script: `bench completions bash > /etc/bash_completion.d/bench`
    /// (zsh: into a folder of $fpath as `_bench`; fish: ~/.config/fish/completions/bench.fish).
    Completions(CompletionsArgs),
    /// Print bench's manual page (roff): `bench man > bench.1 && man -l bench.1`.
    Man,
}

/// Arguments of `bench completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `bench site`.
#[derive(Debug, Args)]
pub struct SiteArgs {
    /// The history store (a SQLite file or a postgres:// URL).
    #[arg(long, env = "BENCH_HISTORY", default_value = crate::history::DEFAULT_LOCATION, value_name = "FILE|URL")]
    pub history: String,
    /// The folder to write the site into (index.html, cells/, runs/, assets/). It is
    /// replaced whole (built beside it, then put in its place), so it must be new, empty
    /// or a site bench wrote; a folder of other files, a file, a dangling link or a place
    /// that cannot be written is refused (exit 2) and left as it was.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: PathBuf,
    /// Only this branch's runs (default: every branch, each its own series).
    #[arg(long)]
    pub branch: Option<String>,
    /// A folder of run folders (DIR/RUN_ID/report.html): each run's page links its report.
    #[arg(long, value_name = "DIR")]
    pub runs: Option<PathBuf>,
    /// The metric to draw.
    #[arg(long, default_value = "tokens_per_s")]
    pub metric: String,
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The run's log file(s), read in this order as one log.
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// The framework that wrote the log (auto: the first step line decides).
    #[arg(long, value_enum, default_value = "auto")]
    pub framework: crate::ingest::Framework,
    /// The model: a bench preset or a recipe model (gpt3-175b); its shape gives the FLOPs.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "params_billion",
        conflicts_with = "params_billion"
    )]
    pub model: Option<String>,
    /// The model's parameter count in billions, when it has no known shape (FLOPs = 6N).
    #[arg(long, value_name = "N")]
    pub params_billion: Option<f64>,
    /// The recipe's own model FLOPs per sequence (e.g. 2.17e16), taken as given.
    #[arg(long, value_name = "FLOPS")]
    pub flops_per_sequence: Option<f64>,
    /// Sequences per optimizer step, all GPUs together.
    #[arg(long, value_name = "B")]
    pub global_batch: u64,
    /// Tokens per sequence.
    #[arg(long, value_name = "S")]
    pub seq_len: u64,
    /// GPUs the run trained on.
    #[arg(long, value_name = "G")]
    pub gpus: u32,
    /// The dtype the matmuls ran in (MFU is against that dtype's peak).
    #[arg(long, value_enum, default_value_t)]
    pub dtype: Dtype,
    /// The GPU (h100, h200, a100, mi300x, mi250x): its peak and hardware key.
    #[arg(long, value_name = "NAME", conflicts_with = "peak_tflops")]
    pub gpu: Option<String>,
    /// Peak dense TFLOP/s of one GPU for the dtype (instead of --gpu).
    #[arg(long, value_name = "P")]
    pub peak_tflops: Option<f64>,
    /// The leading step lines left out as warm-up.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub skip_steps: usize,
    /// The cell id (default: framework.model.dtype.<G>gpu.gbs<B>.seq<S>).
    #[arg(long, value_name = "ID")]
    pub cell: Option<String>,
    /// The run id (default: ingest-<digest of the steps>, so a log ingested again replaces
    /// its run).
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// The hardware key the run is judged under (default: from --gpu).
    #[arg(long, value_name = "KEY")]
    pub hardware_key: Option<String>,
    /// Record the run in this history store and judge it against the cell's past (a
    /// SQLite file or a postgres:// URL).
    #[arg(long, value_name = "FILE|URL")]
    pub history: Option<String>,
    /// Where the run folder is written.
    #[arg(long, default_value = "results", value_name = "DIR")]
    pub results_dir: PathBuf,
    /// Folder of baseline files (decides when the history has no earlier run).
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// Terminal output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

const BISECT_ABOUT: &str = "\
Find the first commit that changed a cell's speed (tokens_per_s).

Run in a git checkout. The commits of good..bad (bad's first-parent line) are checked out one
at a time in a temporary worktree; at each probed commit the --setup command runs there
(through sh -c), then `bench matrix` runs the cell from that commit's own matrix file. Good
and bad are measured first and must differ; then a binary search measures at most
ceil(log2(N)) of the N commits. Each commit is measured in rounds (one `bench matrix` run,
the cell's repeats) until a two-sample test (Mann-Whitney U, Hodges-Lehmann shift; 5% level,
1% floor) calls it like good or like bad, at most --max-repeats repeats.

Every round is recorded in the history under the branch `bisect` (never judged with a
branch's nightly runs). Interrupted (Ctrl-C, exit 130), the same command again resumes: the
recorded rounds are reused, not measured again.

Exit codes: 0 the first bad commit was found; 1 good and bad measure the same, a commit could
not be decided within --max-repeats, or a commit could not be measured (setup or cell
failed); 2 bad input (not a git repository, unknown revision, good not an ancestor of bad,
no such matrix file or cell at good or bad); 130 interrupted.";

#[derive(Debug, Args)]
pub struct BisectArgs {
    /// The cell id (as `bench matrix --dry-run` lists it).
    pub cell: String,
    /// A revision where the cell is as it should be (commit, tag, branch).
    #[arg(long, value_name = "REV")]
    pub good: String,
    /// A later revision where its speed has changed; good must be its ancestor.
    #[arg(long, value_name = "REV")]
    pub bad: String,
    /// The matrix file, relative to the repository's root, read at each probed commit.
    #[arg(long, value_name = "FILE")]
    pub matrix: PathBuf,
    /// Run before measuring a commit, through `sh -c` in its worktree (install, build);
    /// $BENCH_BISECT_COMMIT holds the commit.
    #[arg(long, value_name = "CMD")]
    pub setup: Option<String>,
    /// The history store the probes are recorded in and resumed from (a SQLite file or a
    /// postgres:// URL).
    #[arg(long, env = "BENCH_HISTORY", default_value = crate::history::DEFAULT_LOCATION, value_name = "FILE|URL")]
    pub history: String,
    /// The most repeats of one commit before it is called undecidable (each round adds the
    /// cell's `repeats`).
    #[arg(long, value_name = "N", default_value_t = crate::bisect::DEFAULT_MAX_REPEATS)]
    pub max_repeats: usize,
    /// The bench executable that runs built-in cells at each commit, relative to the
    /// worktree: the commit's own build (`--setup 'cargo build --release' --worker-exe
    /// target/release/bench`) when the change to find is in bench's own workload
    /// (default: this one, which also runs the matrix).
    #[arg(long, value_name = "PATH")]
    pub worker_exe: Option<PathBuf>,
    /// Where the probes' run folders and logs go (default: bench-bisect in the
    /// repository's git directory).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Output format of the final report (progress lines go to stderr).
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct AdaptArgs {
    /// The cell, as JSON.
    #[arg(long)]
    pub cell: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Launcher {
    /// Start one worker process per GPU on this host.
    #[default]
    Local,
    /// Submit each cell as a Slurm job (sbatch + srun).
    Slurm,
}

#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    /// The matrix file.
    #[arg(default_value = "matrix/smoke.yaml")]
    pub file: PathBuf,
    /// Keep only cells matching EXPR (several --filter flags combine with `and`).
    #[arg(long = "filter", short = 'f', value_name = "EXPR")]
    pub filters: Vec<String>,
    /// Refuse a matrix that expands to more than N cells before rules and filters.
    #[arg(long, value_name = "N", env = "BENCH_MAX_CELLS", default_value_t = crate::matrix::budget::DEFAULT_MAX_CELLS)]
    pub max_cells: u64,
    /// List the cells that would run, and the dropped ones with reasons; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// List every dropped cell's id under its rule, not only the counts (in --dry-run's
    /// list and in the terminal summary after the run).
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Output format of the dry run and of the terminal summary.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// Folder that holds one sub-folder per run.
    #[arg(long, default_value = "results", value_name = "DIR")]
    pub results_dir: PathBuf,
    /// Name of this run's folder (default: a UTC timestamp).
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Continue the run in this folder, skipping cells it already finished.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// Folder of baseline files (one per hardware key).
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// Stop at the first failed cell or regression.
    #[arg(long)]
    pub fail_fast: bool,
    /// Stop after N failed cells.
    #[arg(long, value_name = "N")]
    pub max_fail: Option<u32>,
    /// GPUs to use on this host (default: all that are visible; 0 runs on CPU).
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// How cells are started.
    #[arg(long, value_enum, default_value_t)]
    pub launcher: Launcher,
    /// At most N cells in flight at once (default: as many as fit this host's GPUs; under
    /// --launcher slurm, 32 jobs submitted at a time).
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<u32>,
    /// Slurm partition (or $BENCH_SLURM_PARTITION / the matrix's `slurm.partition`).
    #[arg(long)]
    pub partition: Option<String>,
    /// Run only the I-th of N shares of the cells, balanced by expected GPU-seconds (the
    /// history's step times, else the model's FLOPs), e.g. `--shard 2/4`; every shard
    /// gives the same --run-id, and `bench report merge` joins their folders into one run.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Slurm account (or $BENCH_SLURM_ACCOUNT / the matrix's `slurm.account`).
    #[arg(long)]
    pub account: Option<String>,
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// The bench executable that runs built-in cells (`bench worker`), e.g. another build
    /// of bench (default: this one).
    #[arg(long, value_name = "PATH")]
    pub worker_exe: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when a cell is stopped (timeout, Ctrl-C).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub kill_grace: f64,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    #[arg(long, env = "BENCH_GPU_HOUR_PRICE", value_name = "PRICE")]
    pub gpu_hour_price: Option<f64>,
    /// Record the run in this history store (a SQLite file, or a postgres:// URL) and judge
    /// every cell against its own recent runs there.
    #[arg(long, value_name = "FILE|URL")]
    pub history: Option<String>,
    /// Re-run the cells the history finds suspect (one breach) or unknown (too few
    /// repeats to tell) in this job before judging them; the default with --history (kept
    /// for old command lines).
    #[arg(long, requires = "history", conflicts_with = "no_confirm")]
    pub confirm: bool,
    /// Judge from this run alone: a suspect stays suspect (it does not fail the job).
    #[arg(long, requires = "history")]
    pub no_confirm: bool,
    /// GPU-seconds the confirming re-runs may take (default: twice what the run took).
    #[arg(long, requires = "history", value_name = "GPU_SECONDS")]
    pub confirm_budget: Option<f64>,
    /// GPU-seconds the automatic bisection of the run's regressions (and their traced
    /// steps) may take; 0 turns it off. Overrides the matrix's `triage.budget_gpu_s`.
    #[arg(long, requires = "history", value_name = "GPU_SECONDS")]
    pub triage_budget: Option<f64>,
    /// Run through `sh -c` in a worktree at each probed commit before it is measured
    /// (build, install). Overrides the matrix's `triage.setup`.
    #[arg(long, requires = "history", value_name = "CMD")]
    pub triage_setup: Option<String>,
    /// The commit's own build of the worker for built-in cells, relative to the worktree.
    /// Overrides the matrix's `triage.worker`.
    #[arg(long, requires = "history", value_name = "PATH")]
    pub triage_worker: Option<PathBuf>,
    /// Trace one step of every cell (`BENCH_PROFILE`, into the run folder's `kernels/`) and
    /// keep its kernel summary in the history, so a regression's kernels can be diffed
    /// against its last good run without a bisection; as the matrix's
    /// `triage.trace_every_run`.
    #[arg(long)]
    pub trace_kernels: bool,
    /// Run every selected cell N times, whatever its matrix says (the side-by-side
    /// confirmation runs each repeat as a run of its own with `--repeats 1`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub repeats: Option<u32>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReportArgs {
    #[command(subcommand)]
    pub command: Option<ReportCommand>,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    #[arg(long, env = "BENCH_GPU_HOUR_PRICE", value_name = "PRICE")]
    pub gpu_hour_price: Option<f64>,
    /// A run folder, e.g. results/20261122T101500Z.
    pub run_dir: Option<PathBuf>,
    /// Folder of baseline files.
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// Terminal output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary, not only the
    /// counts.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// Post (or update in place) the Markdown report as a pull-request / merge-request comment.
    Post(PostArgs),
    /// Write one self-contained HTML page with charts of one or more runs.
    Html(HtmlArgs),
    /// Merge the run folders of a sharded run (`bench matrix --shard I/N`) into one run
    /// folder, judged and reported as one run; a missing or unfinished shard is named and
    /// fails the exit code. Folders of several runs (an H100 nightly and an MI300X one,
    /// sharded or not) make a fleet folder: each run merged and judged against its own
    /// hardware key in a folder of its own, under one summary, JUnit, report and exit code.
    Merge(MergeArgs),
}

/// Arguments of `bench report merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' run folders (each has the shard.json plan its shard wrote), or whole
    /// runs' folders; the folders of several runs make a fleet.
    #[arg(required = true, num_args = 1..)]
    pub run_dirs: Vec<PathBuf>,
    /// The merged run folder (or fleet folder) to write. It is replaced whole: it must be
    /// new, empty or an earlier merge's output.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: PathBuf,
    /// The hardware kinds the fleet must hold, comma-separated: a hardware key or its start
    /// before a `-` (`h100` is `h100-sxm-80gb`), optionally with its run's shard count
    /// (`h100=2,mi300x`). A kind no run was given for (its runner never uploaded) is named
    /// in the fleet's summary, JUnit, comment and terminal, and fails the exit code. The
    /// output is then always a fleet folder.
    #[arg(long, value_delimiter = ',', value_name = "KIND[=SHARDS]")]
    pub expect_kinds: Vec<String>,
    /// Folder of baseline files.
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// Terminal output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    #[arg(long, env = "BENCH_GPU_HOUR_PRICE", value_name = "PRICE")]
    pub gpu_hour_price: Option<f64>,
}

#[derive(Debug, Args)]
pub struct PostArgs {
    /// A run folder.
    pub run_dir: PathBuf,
    /// Folder of baseline files.
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// github or gitlab (default: detected from the CI environment).
    #[arg(long, value_enum)]
    pub provider: Option<Provider>,
    /// API base URL (default: $GITHUB_API_URL or $CI_API_V4_URL).
    #[arg(long)]
    pub api_url: Option<String>,
    /// owner/name on GitHub, project id or path on GitLab.
    #[arg(long)]
    pub repo: Option<String>,
    /// Pull-request number or merge-request iid.
    #[arg(long)]
    pub pr: Option<u64>,
    /// Post nothing when no cell regressed, improved or is new.
    #[arg(long)]
    pub only_on_change: bool,
    /// Print the comment's body on stdout instead of posting it (no token, no network): what
    /// a pull request would be shown.
    #[arg(long)]
    pub dry_run: bool,
    /// Link to the CI run's artifacts shown in the comment.
    #[arg(long)]
    pub artifacts_url: Option<String>,
    /// Also set a GitHub commit status carrying the verdict.
    #[arg(long)]
    pub commit_status: bool,
    /// Commit the status is set on (default: the pull request's head from $GITHUB_EVENT_PATH, else $GITHUB_SHA).
    #[arg(long)]
    pub sha: Option<String>,
    /// Give up posting after SECS seconds in all (connecting, answers, retries).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
}

/// Where `bench report post` posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Provider {
    Github,
    Gitlab,
}

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(subcommand)]
    pub command: BaselineCommand,
}

#[derive(Debug, Subcommand)]
pub enum BaselineCommand {
    /// Write the measurements of a run into the baseline file of its hardware.
    Update(BaselineUpdateArgs),
    /// Record an intended shift of a cell: its history starts a new segment.
    Accept(BaselineAcceptArgs),
}

#[derive(Debug, Args)]
pub struct BaselineAcceptArgs {
    /// The cell id.
    pub cell: String,
    /// Why the shift is intended (kept with the segment and shown in its trend).
    #[arg(long)]
    pub reason: String,
    /// The history store (a SQLite file or a postgres:// URL).
    #[arg(long, env = "BENCH_HISTORY", default_value = crate::history::DEFAULT_LOCATION, value_name = "FILE|URL")]
    pub history: String,
    /// Hardware key (needed when the cell has history on several).
    #[arg(long)]
    pub hardware: Option<String>,
    /// The first run of the new segment (default: the cell's latest run).
    #[arg(long, value_name = "RUN_ID")]
    pub run: Option<String>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct HistoryArgs {
    #[command(subcommand)]
    pub command: Option<HistoryCommand>,
    /// Show this cell's trend and change points.
    pub cell: Option<String>,
    /// The history store (a SQLite file or a postgres:// URL).
    #[arg(long, env = "BENCH_HISTORY", default_value = crate::history::DEFAULT_LOCATION, value_name = "FILE|URL")]
    pub history: String,
    /// Only this hardware key (default: every key the cell has history on).
    #[arg(long)]
    pub hardware: Option<String>,
    /// The metric to show.
    #[arg(long, default_value = "tokens_per_s")]
    pub metric: String,
}

#[derive(Debug, Subcommand)]
pub enum HistoryCommand {
    /// Back-fill the history from run folders (results.json, telemetry.json).
    Import(HistoryImportArgs),
    /// Calibration: detection and false-alarm rates of the old and new rules, from run
    /// folders of clean repeats and of runs with a BENCH_FUSED_* switch turned off.
    Study(HistoryStudyArgs),
}

#[derive(Debug, Args)]
pub struct HistoryImportArgs {
    /// Run folders, e.g. results/20261122T101500Z.
    pub run_dirs: Vec<PathBuf>,
    /// The history store (a SQLite file or a postgres:// URL).
    #[arg(long, env = "BENCH_HISTORY", default_value = crate::history::DEFAULT_LOCATION, value_name = "FILE|URL")]
    pub history: String,
    /// The branch the runs measured (results do not record it).
    #[arg(long)]
    pub branch: Option<String>,
}

#[derive(Debug, Args)]
pub struct HistoryStudyArgs {
    /// Run folders of the study (clean runs have no BENCH_FUSED_* switch set).
    pub run_dirs: Vec<PathBuf>,
    /// Read the study's runs from this history store instead of run folders (every cell
    /// and hardware key in it; confirmation re-runs left out).
    #[arg(long, value_name = "FILE|URL", conflicts_with = "run_dirs")]
    pub history: Option<String>,
    #[arg(long, default_value = "tokens_per_s")]
    pub metric: String,
    /// Repeats per simulated run (several values give several rows).
    #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
    pub repeats: Vec<usize>,
    #[arg(long, default_value_t = 20_000)]
    pub detect_trials: usize,
    #[arg(long, default_value_t = 200_000)]
    pub alarm_trials: usize,
    /// Band half-width in robust sigmas (default: the policy's).
    #[arg(long)]
    pub sigmas: Option<f64>,
    /// Relative floor of the band (default: the policy's for the metric: 1%, 5% for
    /// tokens_per_joule and kwh_per_1t_tokens).
    #[arg(long)]
    pub floor: Option<f64>,
    /// Relative floor of the repeats' two-sample test (default: the policy's for the
    /// metric, as --floor).
    #[arg(long)]
    pub test_floor: Option<f64>,
    /// Runs of lookback (default: the policy's).
    #[arg(long)]
    pub lookback: Option<usize>,
}

#[derive(Debug, Args)]
pub struct BaselineUpdateArgs {
    /// A run folder.
    pub run_dir: PathBuf,
    /// Only update cells matching EXPR.
    #[arg(long = "filter", short = 'f', value_name = "EXPR")]
    pub filters: Vec<String>,
    /// Only raise baselines where the run improved on them (and add new cells).
    #[arg(long)]
    pub only_improvements: bool,
    /// Folder of baseline files.
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

/// Arguments of `bench worker`. `cell::Cell::worker_args` produces them; keep both in step.
/// [`super::resolve`] turns them into [`crate::workload::WorkerSettings`].
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The cell id, echoed in events and logs.
    #[arg(long, default_value = "adhoc")]
    pub cell_id: String,
    /// Model preset (see `bench worker --list-models`).
    #[arg(long, default_value = "gpt2-tiny")]
    pub model: String,
    /// The dtype the matmuls run in. It defaults to `Dtype::default()` (bf16), the same
    /// default a cell without a `dtype` axis gets, so that a worker started by hand
    /// measures what the runner would; pass `--dtype fp32` for an exact run on a CPU.
    #[arg(long, value_enum, default_value_t)]
    pub dtype: Dtype,
    #[arg(long, value_enum, default_value_t)]
    pub parallel: Parallel,
    /// Comma-separated feature flags: compile, sac.
    #[arg(long, value_delimiter = ',')]
    pub features: Vec<String>,
    #[arg(long, default_value_t = 30)]
    pub steps: u32,
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,
    #[arg(long, default_value_t = 128)]
    pub seq_len: u32,
    #[arg(long, default_value_t = 4)]
    pub micro_batch: u32,
    #[arg(long, default_value_t = 1)]
    pub grad_accum: u32,
    #[arg(long, default_value_t = 1)]
    pub sac_every: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 3e-4)]
    pub lr: f64,
    /// Token file (.bin of uint16 or uint32 tokens); synthetic tokens when absent.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Synthetic tokens when no --data: random (uniform) or pattern (a learnable sequence
    /// whose loss falls, for correctness checks).
    #[arg(long, default_value = "random")]
    pub synthetic: String,
    /// Element width of the token file: 2 (uint16) or 4 (uint32).
    #[arg(long, default_value_t = 2)]
    pub data_bytes: u8,
    /// cpu, cuda, cuda:N or auto (cuda when available, else cpu).
    #[arg(long, default_value_t)]
    pub device: Device,
    /// List the model presets and exit.
    #[arg(long)]
    pub list_models: bool,
}

/// Arguments of `bench report html`.
#[derive(Debug, Args)]
pub struct HtmlArgs {
    /// One or more run folders, e.g. results/20261122T101500Z.
    #[arg(required = true, num_args = 1..)]
    pub run_dirs: Vec<PathBuf>,
    /// Trends of earlier runs to draw: a history store (a SQLite file or a postgres://
    /// URL, as `bench matrix --history` records), or a JSON file (`{"series": [{"cell",
    /// "metric", "points": [{"time", "commit", "value", "change_point"}]}]}`).
    #[arg(long, value_name = "FILE|URL")]
    pub history: Option<PathBuf>,
    /// Folder of baseline files.
    #[arg(long, default_value = "baselines", value_name = "DIR")]
    pub baselines: PathBuf,
    /// Where to write the page (default: report.html in the run folder, or in the current
    /// folder for several runs).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}
