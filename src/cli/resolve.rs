//! Resolution: raw arguments ([`super::args`]) into the settings each stage defines.
//!
//! Defaults that clap cannot express and checks of single values live here (a grace
//! period that is not a number of seconds, `--jobs 0`, a run id that would name a folder
//! outside `--results-dir`, a folder to write that is a dangling link, a file or read-only
//! ([`crate::files::output_folder`])), failing as bad input (exit 2) before any stage
//! starts.
//! Environment fallbacks declared on the arguments (`BENCH_MAX_CELLS`, `BENCH_HISTORY`,
//! `BENCH_GPU_HOUR_PRICE`) are already applied by clap when these functions run; settings
//! that merge the matrix file with the environment (Slurm) are resolved by their stage once
//! the matrix is loaded.

use std::time::Duration;

use super::args::{
    BaselineAcceptArgs, BaselineUpdateArgs, BisectArgs, EnvArgs, HistoryArgs, HistoryImportArgs,
    HistoryStudyArgs, HtmlArgs, IngestArgs, Launcher, MatrixArgs, MergeArgs, PostArgs, Provider,
    ReportArgs, SiteArgs, WorkerArgs,
};
use crate::baseline::cmd::UpdateSettings;
use crate::bisect::BisectSettings;
use crate::commands::merge::MergeSettings;
use crate::commands::report::{HtmlSettings, PostSettings, ReportSettings};
use crate::env::EnvSettings;
use crate::error::CliError;
use crate::history::cmd::{AcceptSettings, ImportSettings, ShowSettings, StudySettings};
use crate::matrix::cmd::{DryRunSettings, MatrixSource};
use crate::publish::TargetFlags;
use crate::run::{check_run_id, Launch, LauncherRequest, MatrixSettings, RunConfig};
use crate::workload::WorkerSettings;

/// The matrix a `bench matrix` command reads.
fn source(args: &MatrixArgs) -> MatrixSource {
    MatrixSource {
        file: args.file.clone(),
        filters: args.filters.clone(),
        max_cells: args.max_cells,
    }
}

/// `bench matrix --dry-run`.
pub(crate) fn dry_run(args: &MatrixArgs) -> DryRunSettings {
    DryRunSettings {
        source: source(args),
        format: args.format,
        verbose: args.verbose,
    }
}

/// `bench matrix` without `--dry-run`. The run's settings use the local launcher; a
/// `--launcher slurm` request is resolved by `run::run_matrix` once the matrix's `slurm:`
/// block is known.
pub(crate) fn matrix(args: &MatrixArgs) -> Result<MatrixSettings, CliError> {
    Ok(MatrixSettings {
        source: source(args),
        config: run_config(args)?,
        launcher: match args.launcher {
            Launcher::Local => LauncherRequest::Local,
            Launcher::Slurm => LauncherRequest::Slurm {
                partition: args.partition.clone(),
                account: args.account.clone(),
            },
        },
        baselines: args.baselines.clone(),
        format: args.format,
        verbose: args.verbose,
        gpu_hour_price: args.gpu_hour_price,
        history: args.history.clone(),
        confirm: !args.no_confirm,
        confirm_budget_gpu_s: match args.confirm_budget {
            Some(b) if !(b.is_finite() && b >= 0.0) => {
                return Err(CliError::bad_input(miette::miette!(
                    "--confirm-budget: {b} is not a number of GPU-seconds (0 or more)"
                )))
            }
            b => b,
        },
        triage: crate::run::TriageFlags {
            budget_gpu_s: match args.triage_budget {
                Some(b)
                    if !(b.is_finite()
                        && (0.0..=crate::matrix::MAX_TRIAGE_BUDGET_GPU_S).contains(&b)) =>
                {
                    return Err(CliError::bad_input(miette::miette!(
                        "--triage-budget: {b} is not a number of GPU-seconds from 0 to {:e}",
                        crate::matrix::MAX_TRIAGE_BUDGET_GPU_S
                    )))
                }
                b => b,
            },
            setup: args.triage_setup.clone(),
            worker: args.triage_worker.clone(),
        },
        shard: shard(args)?,
        repeats: args.repeats,
    })
}

/// `--shard I/N`: malformed, `0/N`, `I>N` and `N=0` are bad input. The shards of one run
/// share its run id (that is how their cells meet in the history and the merge), so a
/// shard needs `--run-id` (or `--resume`, whose folder names the run): with a timestamp
/// each shard would start a run of its own.
fn shard(args: &MatrixArgs) -> Result<Option<crate::shard::Shard>, CliError> {
    let Some(text) = &args.shard else {
        return Ok(None);
    };
    let shard: crate::shard::Shard = text
        .parse()
        .map_err(|e: String| CliError::bad_input(miette::miette!("{e}")))?;
    if args.run_id.is_none() && args.resume.is_none() {
        return Err(CliError::bad_input(miette::miette!(
            "--shard {shard}: give every shard the same --run-id, so their cells make one run (e.g. --run-id nightly-$CI_PIPELINE_ID)"
        )));
    }
    Ok(Some(shard))
}

/// The run's own settings: a grace period that is not a finite, non-negative number of
/// seconds, `--jobs 0` and a run id that does not name one folder are bad input.
fn run_config(args: &MatrixArgs) -> Result<RunConfig, CliError> {
    let grace = Duration::try_from_secs_f64(args.kill_grace).map_err(|_| {
        CliError::bad_input(miette::miette!(
            "--kill-grace {}: expected a non-negative number of seconds",
            args.kill_grace
        ))
    })?;
    if let Some(id) = &args.run_id {
        check_run_id(id)?;
    }
    // A resumed run writes into its own folder, which --resume names; only a new one is
    // made under --results-dir.
    if args.resume.is_none() {
        crate::files::output_folder("--results-dir", &args.results_dir)?;
    }
    let jobs = match args.jobs {
        Some(0) => {
            return Err(CliError::bad_input(miette::miette!(
                "--jobs 0: at least one cell must be able to run"
            )))
        }
        j => j.map(|j| j as usize),
    };
    Ok(RunConfig {
        results_dir: args.results_dir.clone(),
        run_id: args.run_id.clone(),
        resume: args.resume.clone(),
        fail_fast: args.fail_fast,
        max_fail: args.max_fail,
        gpus: args.gpus,
        grace,
        matrix: args.file.clone(),
        filters: args.filters.clone(),
        no_progress: args.no_progress,
        bench_exe: args.worker_exe.clone(),
        launcher: Launch::Local,
        jobs,
        trace_kernels: args.trace_kernels,
    })
}

/// `bench report RUN_DIR`: the run folder is optional to clap only because the command
/// also has subcommands; without one it is bad input.
pub(crate) fn report(args: &ReportArgs) -> Result<ReportSettings, CliError> {
    let Some(run_dir) = &args.run_dir else {
        return Err(CliError::bad_input(miette::miette!(
            "bench report needs a run folder, e.g. `bench report results/20261122T101500Z`"
        )));
    };
    Ok(ReportSettings {
        run_dir: run_dir.clone(),
        baselines: args.baselines.clone(),
        format: args.format,
        verbose: args.verbose,
        gpu_hour_price: args.gpu_hour_price,
    })
}

impl PostArgs {
    /// The flags that say where to post, for [`crate::publish::resolve_target`] (the
    /// publisher never sees clap's types).
    pub fn target_flags(&self) -> TargetFlags {
        TargetFlags {
            provider: self.provider.map(|p| match p {
                Provider::Github => crate::publish::Provider::GitHub,
                Provider::Gitlab => crate::publish::Provider::GitLab,
            }),
            api_url: self.api_url.clone(),
            repo: self.repo.clone(),
            pr: self.pr,
            artifacts_url: self.artifacts_url.clone(),
            sha: self.sha.clone(),
        }
    }
}

/// `bench report post`: `--timeout` must be a positive number of seconds.
pub(crate) fn post(args: &PostArgs) -> Result<PostSettings, CliError> {
    let deadline = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            CliError::bad_input(miette::Report::msg(format!(
                "--timeout {}: expected a positive number of seconds",
                args.timeout
            )))
        })?;
    Ok(PostSettings {
        run_dir: args.run_dir.clone(),
        baselines: args.baselines.clone(),
        target: args.target_flags(),
        only_on_change: args.only_on_change,
        dry_run: args.dry_run,
        commit_status: args.commit_status,
        deadline,
    })
}

/// `bench report merge` (its `-o` is checked with its inputs, `commands::fleet`).
pub(crate) fn merge(args: &MergeArgs) -> MergeSettings {
    MergeSettings {
        run_dirs: args.run_dirs.clone(),
        output: args.output.clone(),
        baselines: args.baselines.clone(),
        format: args.format,
        verbose: args.verbose,
        gpu_hour_price: args.gpu_hour_price,
        expect_kinds: args.expect_kinds.clone(),
        run_stdout: true,
    }
}

/// `bench report html`: a `-o` that cannot be written is bad input before any run is read.
pub(crate) fn html(args: &HtmlArgs) -> Result<HtmlSettings, CliError> {
    if let Some(out) = &args.output {
        crate::files::output_file("-o", out)?;
    }
    Ok(HtmlSettings {
        run_dirs: args.run_dirs.clone(),
        history: args.history.clone(),
        baselines: args.baselines.clone(),
        output: args.output.clone(),
    })
}

/// `bench site`: an empty branch or metric names nothing (exit 2, naming the flag).
pub(crate) fn site(args: &SiteArgs) -> Result<crate::site::SiteSettings, CliError> {
    if args.branch.as_deref().is_some_and(|b| b.trim().is_empty()) {
        return Err(CliError::bad_input(miette::miette!(
            "--branch: empty; give a branch name, or leave the flag out for every branch"
        )));
    }
    if args.metric.trim().is_empty() {
        return Err(CliError::bad_input(miette::miette!("--metric: empty")));
    }
    Ok(crate::site::SiteSettings {
        history: args.history.clone(),
        output: args.output.clone(),
        branch: args.branch.clone(),
        runs: args.runs.clone(),
        metric: args.metric.clone(),
    })
}

/// `bench env`.
pub(crate) fn env(args: &EnvArgs) -> EnvSettings {
    EnvSettings {
        format: args.format,
    }
}

/// `bench baseline update`: it writes into `--baselines`, which must be a folder it can
/// write (or make).
pub(crate) fn update(args: &BaselineUpdateArgs) -> Result<UpdateSettings, CliError> {
    crate::files::output_folder("--baselines", &args.baselines)?;
    Ok(UpdateSettings {
        run_dir: args.run_dir.clone(),
        filters: args.filters.clone(),
        only_improvements: args.only_improvements,
        baselines: args.baselines.clone(),
    })
}

/// `bench baseline accept`: the hardware key and run id are checked as every command
/// checks them ([`crate::ids`]).
pub(crate) fn accept(args: &BaselineAcceptArgs) -> Result<AcceptSettings, CliError> {
    if let Some(key) = &args.hardware {
        crate::ids::check_hardware_key("--hardware", key)?;
    }
    if let Some(run) = &args.run {
        crate::ids::check_run_id("--run", run)?;
    }
    Ok(AcceptSettings {
        cell: args.cell.clone(),
        reason: args.reason.clone(),
        history: args.history.clone(),
        hardware: args.hardware.clone(),
        run: args.run.clone(),
    })
}

/// `bench history CELL`: the cell is optional to clap only because the command also has
/// subcommands; without either it is bad input.
pub(crate) fn show(args: &HistoryArgs) -> Result<ShowSettings, CliError> {
    let Some(cell) = &args.cell else {
        return Err(CliError::bad_input(miette::miette!(
            "bench history needs a cell id (`bench history gpt2-125m.bf16.1gpu.single.compile`) or a subcommand (import, study)"
        )));
    };
    if let Some(key) = &args.hardware {
        crate::ids::check_hardware_key("--hardware", key)?;
    }
    Ok(ShowSettings {
        cell: cell.clone(),
        history: args.history.clone(),
        hardware: args.hardware.clone(),
        metric: args.metric.clone(),
    })
}

/// `bench history import`.
pub(crate) fn import(args: &HistoryImportArgs) -> ImportSettings {
    ImportSettings {
        run_dirs: args.run_dirs.clone(),
        history: args.history.clone(),
        branch: args.branch.clone(),
    }
}

/// The most repeats per simulated run `bench history study` takes (a cell has at most a
/// few dozen clean repeats to draw from).
pub(crate) const MAX_STUDY_REPEATS: usize = 100;
/// The most values of `--repeats` (rows per cell).
pub(crate) const MAX_STUDY_REPEAT_ROWS: usize = 16;
/// The most trials of one rate: 1e6 puts a rate's rule-of-three bound at 0.0003%, and
/// keeps the table to minutes.
pub(crate) const MAX_STUDY_TRIALS: usize = 1_000_000;
/// The longest lookback (runs of history).
pub(crate) const MAX_STUDY_LOOKBACK: usize = 1_000;
/// The widest band, in robust sigmas.
pub(crate) const MAX_STUDY_SIGMAS: f64 = 100.0;

/// `bench history study`: each knob within its range (exit 2 naming the flag otherwise),
/// so the simulation's work is bounded and no table is printed for a policy that cannot be.
pub(crate) fn study(args: &HistoryStudyArgs) -> Result<StudySettings, CliError> {
    let bad = |m: String| CliError::bad_input(miette::miette!("{m}"));
    if args.repeats.is_empty() || args.repeats.len() > MAX_STUDY_REPEAT_ROWS {
        return Err(bad(format!(
            "--repeats: give 1 to {MAX_STUDY_REPEAT_ROWS} values (comma-separated)"
        )));
    }
    if let Some(r) = args
        .repeats
        .iter()
        .find(|r| !(1..=MAX_STUDY_REPEATS).contains(*r))
    {
        return Err(bad(format!(
            "--repeats {r}: repeats per simulated run are 1 to {MAX_STUDY_REPEATS}"
        )));
    }
    for (flag, v) in [
        ("--detect-trials", args.detect_trials),
        ("--alarm-trials", args.alarm_trials),
    ] {
        if !(1..=MAX_STUDY_TRIALS).contains(&v) {
            return Err(bad(format!(
                "{flag} {v}: trials are 1 to {MAX_STUDY_TRIALS}"
            )));
        }
    }
    if let Some(s) = args.sigmas {
        if !(s.is_finite() && s > 0.0 && s <= MAX_STUDY_SIGMAS) {
            return Err(bad(format!(
                "--sigmas {s}: the band's half-width is above 0 and at most {MAX_STUDY_SIGMAS} robust sigmas"
            )));
        }
    }
    if let Some(f) = args.floor {
        if !(f.is_finite() && (0.0..1.0).contains(&f)) {
            return Err(bad(format!(
                "--floor {f}: the band's relative floor is 0 or more and below 1 (0.01 is 1%)"
            )));
        }
    }
    if let Some(f) = args.test_floor {
        if !(f.is_finite() && (0.0..1.0).contains(&f)) {
            return Err(bad(format!(
                "--test-floor {f}: the repeats' test's relative floor is 0 or more and below 1 (0.01 is 1%)"
            )));
        }
    }
    if let Some(l) = args.lookback {
        if !(2..=MAX_STUDY_LOOKBACK).contains(&l) {
            return Err(bad(format!(
                "--lookback {l}: the lookback is 2 to {MAX_STUDY_LOOKBACK} runs"
            )));
        }
    }
    Ok(StudySettings {
        run_dirs: args.run_dirs.clone(),
        history: args.history.clone(),
        metric: args.metric.clone(),
        repeats: args.repeats.clone(),
        detect_trials: args.detect_trials,
        alarm_trials: args.alarm_trials,
        sigmas: args.sigmas,
        floor: args.floor,
        test_floor: args.test_floor,
        lookback: args.lookback,
    })
}

/// `bench bisect`: the matrix must be a relative path (it is read in each probed commit's
/// tree), `--max-repeats` at least 1, a `--setup` command not blank and a `--work-dir` a
/// folder it can write.
pub(crate) fn bisect(args: &BisectArgs) -> Result<BisectSettings, CliError> {
    if args.matrix.is_absolute()
        || args
            .matrix
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(CliError::bad_input(miette::miette!(
            "--matrix {}: give the matrix file's path inside the repository (relative to its root, no `..`): it is read from each probed commit's tree",
            args.matrix.display()
        )));
    }
    if let Some(exe) = &args.worker_exe {
        if exe.is_absolute()
            || exe
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(CliError::bad_input(miette::miette!(
                "--worker-exe {}: give the path of the commit's build inside the worktree (relative, no `..`)",
                exe.display()
            )));
        }
    }
    if args.max_repeats == 0 {
        return Err(CliError::bad_input(miette::miette!(
            "--max-repeats 0: a commit needs at least one repeat"
        )));
    }
    if args.setup.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(CliError::bad_input(miette::miette!(
            "--setup: the command is empty; leave the flag out to run no setup"
        )));
    }
    if let Some(dir) = &args.work_dir {
        crate::files::output_folder("--work-dir", dir)?;
    }
    Ok(BisectSettings {
        cell: args.cell.clone(),
        good: args.good.clone(),
        bad: args.bad.clone(),
        matrix: args.matrix.clone(),
        setup: args.setup.clone(),
        history: args.history.clone(),
        max_repeats: args.max_repeats,
        worker_exe: args.worker_exe.clone(),
        work_dir: args.work_dir.clone(),
        format: args.format,
    })
}

/// The smallest model `--params-billion` takes: a million parameters.
pub(crate) const MIN_PARAMS_BILLION: f64 = 1e-3;
/// The largest: a hundred trillion parameters.
pub(crate) const MAX_PARAMS_BILLION: f64 = 1e5;
/// The lowest peak `--peak-tflops` takes (10 GFLOP/s, about one CPU core).
pub(crate) const MIN_PEAK_TFLOPS: f64 = 0.01;

/// `bench ingest`: the run id and hardware key first (nothing is read or written under a
/// name that could leave its folder), a `--results-dir` it can write, counts above zero,
/// a parameter count, peak and GPU count within physical bounds; the model, peak and cell
/// are checked by the stage (`ingest::model`, `ingest::figures`).
pub(crate) fn ingest(args: &IngestArgs) -> Result<crate::ingest::IngestSettings, CliError> {
    use crate::ingest::{model::ModelSpec, PeakSource};
    let bad = |m: String| CliError::bad_input(miette::miette!("{m}"));
    if let Some(id) = &args.run_id {
        crate::ids::check_run_id("--run-id", id)?;
    }
    if let Some(key) = &args.hardware_key {
        crate::ids::check_hardware_key("--hardware-key", key)?;
    }
    crate::files::output_folder("--results-dir", &args.results_dir)?;
    for (flag, v) in [
        ("--global-batch", args.global_batch),
        ("--seq-len", args.seq_len),
        ("--gpus", u64::from(args.gpus)),
    ] {
        if v == 0 {
            return Err(bad(format!("{flag} 0: it must be at least 1")));
        }
    }
    let max_gpus = crate::bounds::MAX_WORLD_SIZE;
    if u64::from(args.gpus) > max_gpus {
        return Err(bad(format!(
            "--gpus {}: a run has 1 to {max_gpus} GPUs",
            args.gpus
        )));
    }
    if let Some(b) = args.params_billion {
        if !(b.is_finite() && (MIN_PARAMS_BILLION..=MAX_PARAMS_BILLION).contains(&b)) {
            return Err(bad(format!(
                "--params-billion {b}: a model has {MIN_PARAMS_BILLION} to {MAX_PARAMS_BILLION} billion parameters (1e-3 is a million)"
            )));
        }
    }
    if let Some(f) = args.flops_per_sequence {
        if !(f.is_finite() && (1.0..=1e30).contains(&f)) {
            return Err(bad(format!(
                "--flops-per-sequence {f}: a number of FLOPs from 1 to 1e30"
            )));
        }
    }
    if let Some(p) = args.peak_tflops {
        let max = crate::metrics::flops::UNKNOWN_DEVICE_TFLOPS;
        if !(p.is_finite() && (MIN_PEAK_TFLOPS..=max).contains(&p)) {
            return Err(bad(format!(
                "--peak-tflops {p}: one GPU's dense peak is {MIN_PEAK_TFLOPS} to {max} TFLOP/s"
            )));
        }
    }
    if args
        .global_batch
        .checked_mul(args.seq_len)
        .is_none_or(|t| t > 1 << 50)
    {
        return Err(bad(format!(
            "--global-batch {} x --seq-len {}: more tokens per step than any run has",
            args.global_batch, args.seq_len
        )));
    }
    let model = match (&args.model, args.params_billion) {
        (Some(m), _) => ModelSpec::Named(m.clone()),
        (None, Some(b)) => ModelSpec::ParamsBillion(b),
        (None, None) => return Err(bad("give --model NAME or --params-billion N".into())),
    };
    let peak = match (&args.gpu, args.peak_tflops) {
        (Some(g), _) => PeakSource::Gpu(g.clone()),
        (None, Some(p)) => PeakSource::Tflops(p),
        (None, None) => PeakSource::None,
    };
    Ok(crate::ingest::IngestSettings {
        logs: args.logs.clone(),
        framework: args.framework,
        model,
        flops_per_sequence: args.flops_per_sequence,
        global_batch: args.global_batch,
        seq_len: args.seq_len,
        gpus: args.gpus,
        dtype: args.dtype,
        peak,
        skip_steps: args.skip_steps,
        cell: args.cell.clone(),
        run_id: args.run_id.clone(),
        hardware_key: args.hardware_key.clone(),
        history: args.history.clone(),
        results_dir: args.results_dir.clone(),
        baselines: args.baselines.clone(),
        format: args.format,
    })
}

/// `bench worker`: the axes arrive typed (clap parsed them through `axes`), so this only
/// copies; the worker checks the values against its presets ([`crate::workload::Settings`]).
pub(crate) fn worker(args: &WorkerArgs) -> WorkerSettings {
    WorkerSettings {
        cell_id: args.cell_id.clone(),
        model: args.model.clone(),
        dtype: args.dtype,
        parallel: args.parallel,
        features: args.features.clone(),
        steps: args.steps,
        warmup: args.warmup,
        seq_len: args.seq_len,
        micro_batch: args.micro_batch,
        grad_accum: args.grad_accum,
        sac_every: args.sac_every,
        seed: args.seed,
        lr: args.lr,
        data: args.data.clone(),
        synthetic: args.synthetic.clone(),
        data_bytes: args.data_bytes,
        device: args.device,
        list_models: args.list_models,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use indexmap::IndexMap;

    use super::*;
    use crate::axes::{Device, Dtype, Parallel};
    use crate::cell::{Cell, CellId, Params};
    use crate::cli::{Cli, Command, HistoryCommand, ReportCommand};

    fn parse(argv: &[&str]) -> Command {
        Cli::try_parse_from(["bench"].iter().chain(argv))
            .expect("valid arguments")
            .command
    }

    fn matrix_args(extra: &[&str]) -> MatrixArgs {
        match parse(&[&["matrix", "m.yaml"][..], extra].concat()) {
            Command::Matrix(a) => a,
            other => panic!("not a matrix command: {other:?}"),
        }
    }

    fn bad_input(e: CliError) -> String {
        assert_eq!(e.exit_code(), crate::exit::bench::BAD_INPUT, "{e:?}");
        format!("{:#}", e.report())
    }

    proptest::proptest! {
        /// Every `bench history study` knob outside its range is exit 2 naming the flag;
        /// inside it, the settings resolve.
        #[test]
        fn study_knobs_are_bounded(lookback in proptest::prelude::any::<u64>(), repeats in 0usize..2_000, trials in 0u64..10_000_000, sigmas in proptest::prelude::any::<f64>(), floor in proptest::prelude::any::<f64>(), test_floor in proptest::prelude::any::<f64>()) {
            let argv = [
                "history".to_string(), "study".into(), "r".into(),
                format!("--lookback={lookback}"), format!("--repeats={repeats}"),
                format!("--alarm-trials={trials}"), format!("--sigmas={sigmas}"), format!("--floor={floor}"),
                format!("--test-floor={test_floor}"),
            ];
            let Ok(cli) = Cli::try_parse_from(std::iter::once("bench".to_string()).chain(argv)) else {
                return Ok(());
            };
            let Command::History(h) = cli.command else { panic!() };
            let Some(HistoryCommand::Study(a)) = &h.command else { panic!() };
            let ok = (2..=MAX_STUDY_LOOKBACK as u64).contains(&lookback)
                && (1..=MAX_STUDY_REPEATS).contains(&repeats)
                && (1..=MAX_STUDY_TRIALS as u64).contains(&trials)
                && sigmas.is_finite() && sigmas > 0.0 && sigmas <= MAX_STUDY_SIGMAS
                && floor.is_finite() && (0.0..1.0).contains(&floor)
                && test_floor.is_finite() && (0.0..1.0).contains(&test_floor);
            match study(a) {
                Ok(_) => proptest::prop_assert!(ok),
                Err(e) => {
                    proptest::prop_assert!(!ok);
                    let m = bad_input(e);
                    proptest::prop_assert!(m.starts_with("--"), "{}", m);
                }
            }
        }
    }

    /// One default per axis: a worker started without `--dtype`, `--parallel` or
    /// `--device` runs what a cell without those axes would ask for.
    #[test]
    fn worker_defaults_are_the_cells() {
        let Command::Worker(args) = parse(&["worker"]) else {
            panic!("not a worker command")
        };
        let w = worker(&args);
        let values = IndexMap::new();
        let cell = Cell {
            id: CellId::from_values(&values),
            values,
            params: Params::default(),
        };
        assert_eq!(w.dtype, Dtype::default());
        assert_eq!(w.dtype, cell.dtype());
        assert_eq!(w.dtype, Dtype::Bf16);
        assert_eq!(w.parallel, Parallel::default());
        assert_eq!(w.parallel, cell.parallel());
        assert_eq!(w.device, Device::default());
    }

    #[test]
    fn matrix_settings_carry_the_flags() {
        let s = matrix(&matrix_args(&[
            "--launcher",
            "slurm",
            "--partition",
            "h100",
            "--jobs",
            "3",
            "--kill-grace",
            "2.5",
            "-f",
            "gpus=1",
            "--run-id",
            "nightly.1",
            "--verbose",
        ]))
        .unwrap();
        assert_eq!(
            s.launcher,
            LauncherRequest::Slurm {
                partition: Some("h100".into()),
                account: None,
            }
        );
        assert_eq!(s.config.launcher, Launch::Local);
        assert_eq!(s.config.jobs, Some(3));
        assert_eq!(s.config.grace, Duration::from_millis(2500));
        assert_eq!(s.source.filters, ["gpus=1"]);
        assert_eq!(s.config.filters, s.source.filters);
        assert_eq!(s.config.matrix, s.source.file);
        assert_eq!(s.config.run_id.as_deref(), Some("nightly.1"));
        assert_eq!(s.shard, None);
        let sharded = matrix(&matrix_args(&["--run-id", "n", "--shard", "2/3"])).unwrap();
        assert_eq!(
            sharded.shard,
            Some(crate::shard::Shard { index: 2, count: 3 })
        );
        assert!(s.verbose);
        assert!(!matrix(&matrix_args(&[])).unwrap().verbose);
    }

    #[test]
    fn single_values_are_checked_as_bad_input() {
        for (flags, says) in [
            (&["--kill-grace=-1"][..], "--kill-grace -1"),
            (&["--kill-grace", "NaN"][..], "--kill-grace NaN"),
            (&["--jobs", "0"][..], "--jobs 0"),
            (&["--run-id", "../x"][..], "--run-id \"../x\""),
            (&["--run-id", "r", "--shard", "0/2"][..], "between 1 and 2"),
            (&["--run-id", "r", "--shard", "3/2"][..], "between 1 and 2"),
            (&["--run-id", "r", "--shard", "1/0"][..], "at least 1"),
            (
                &["--run-id", "r", "--shard", "one/two"][..],
                "not a whole number",
            ),
            (&["--run-id", "r", "--shard", "1-2"][..], "expected I/N"),
            (&["--shard", "1/2"][..], "same --run-id"),
        ] {
            let msg = bad_input(matrix(&matrix_args(flags)).unwrap_err());
            assert!(msg.contains(says), "{flags:?}: {msg}");
        }
        let Command::Report(r) = parse(&["report", "post", "results/x", "--timeout", "0"]) else {
            panic!("not a report command")
        };
        let Some(ReportCommand::Post(p)) = &r.command else {
            panic!("not a post command")
        };
        assert!(bad_input(post(p).unwrap_err()).contains("--timeout 0"));
    }

    #[test]
    fn ingest_settings_are_checked_as_bad_input() {
        let ingest_args = |extra: &[&str]| {
            let base = ["ingest", "run.log", "--seq-len", "16"];
            match parse(&[&base[..], extra].concat()) {
                Command::Ingest(a) => a,
                other => panic!("not an ingest command: {other:?}"),
            }
        };
        let s = ingest(&ingest_args(&[
            "--gpus",
            "2",
            "--model",
            "llama-tiny",
            "--gpu",
            "h100",
            "--global-batch",
            "8",
        ]))
        .unwrap();
        assert_eq!(s.skip_steps, 1);
        assert_eq!(s.peak, crate::ingest::PeakSource::Gpu("h100".into()));
        assert_eq!(
            s.model,
            crate::ingest::model::ModelSpec::Named("llama-tiny".into())
        );
        let s = ingest(&ingest_args(&[
            "--gpus",
            "2",
            "--params-billion",
            "7",
            "--global-batch",
            "8",
        ]))
        .unwrap();
        assert_eq!(s.peak, crate::ingest::PeakSource::None);
        for (flags, says) in [
            (
                &["--gpus", "0", "--model", "m", "--global-batch", "8"][..],
                "--gpus 0",
            ),
            (
                &["--gpus", "1", "--model", "m", "--global-batch", "0"][..],
                "--global-batch 0",
            ),
        ] {
            let msg = bad_input(ingest(&ingest_args(flags)).unwrap_err());
            assert!(msg.contains(says), "{flags:?}: {msg}");
        }
    }

    #[test]
    fn bisect_settings_are_checked_as_bad_input() {
        let bisect_args = |extra: &[&str]| {
            let base = ["bisect", "c", "--good", "g", "--bad", "b"];
            match parse(&[&base[..], extra].concat()) {
                Command::Bisect(a) => a,
                other => panic!("not a bisect command: {other:?}"),
            }
        };
        let s = bisect(&bisect_args(&[
            "--matrix",
            "matrix/m.yaml",
            "--worker-exe",
            "target/release/bench",
        ]))
        .unwrap();
        assert_eq!(s.max_repeats, crate::bisect::DEFAULT_MAX_REPEATS);
        assert_eq!(s.matrix, std::path::PathBuf::from("matrix/m.yaml"));
        for (flags, says) in [
            (&["--matrix", "/m.yaml"][..], "--matrix /m.yaml"),
            (&["--matrix", "../m.yaml"][..], "--matrix ../m.yaml"),
            (
                &["--matrix", "m.yaml", "--max-repeats", "0"][..],
                "--max-repeats 0",
            ),
            (&["--matrix", "m.yaml", "--setup", " "][..], "--setup"),
            (
                &["--matrix", "m.yaml", "--worker-exe", "/b"][..],
                "--worker-exe /b",
            ),
        ] {
            let msg = bad_input(bisect(&bisect_args(flags)).unwrap_err());
            assert!(msg.contains(says), "{flags:?}: {msg}");
        }
        let m = matrix(&matrix_args(&["--worker-exe", "old/bench"])).unwrap();
        assert_eq!(m.config.bench_exe, Some("old/bench".into()));
    }

    /// A command that has subcommands takes its own operand as optional; without either
    /// it is bad input, not a clap error.
    #[test]
    fn a_missing_operand_is_bad_input() {
        let Command::Report(r) = parse(&["report"]) else {
            panic!("not a report command")
        };
        assert!(bad_input(report(&r).unwrap_err()).contains("needs a run folder"));
        let Command::History(h) = parse(&["history"]) else {
            panic!("not a history command")
        };
        assert!(h.command.is_none());
        assert!(bad_input(show(&h).unwrap_err()).contains("needs a cell id"));
        let Command::History(h) = parse(&["history", "import", "r1", "--branch", "main"]) else {
            panic!("not a history command")
        };
        let Some(HistoryCommand::Import(i)) = &h.command else {
            panic!("not an import command")
        };
        let s = import(i);
        assert_eq!(s.branch.as_deref(), Some("main"));
        assert_eq!(s.run_dirs, [std::path::PathBuf::from("r1")]);
    }
}
