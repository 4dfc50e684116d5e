//! An ingested run as a run of bench: a run folder with `results.json` (one passed cell,
//! its steps and metrics), `ingest.json` (what was read and how every figure was
//! computed) and the reports `bench report` renders (`summary.md`, `junit.xml`,
//! `report.html`, `frameworks.md`); with `--history`, the run recorded in the store and
//! judged by the history gate like a cell of `bench matrix --history`, whose verdict every
//! report and the exit code then carry.

use std::path::Path;

use indexmap::IndexMap;
use sha2::Digest;

use super::error::IngestError;
use super::figures::{Figures, Log};
use super::model::ModelFlops;
use super::settings::{IngestSettings, PeakSource};
use crate::cell::{CellId, Params, Value};
use crate::error::CliError;
use crate::events::{StepEvent, SummaryEvent};
use crate::history::gate::{ConfirmOutcome, CONFIRM_SUFFIX};
use crate::metrics::flops::Peak;
use crate::results::{CellResult, Environment, Outcome, Repeat, RunResults};

/// The file in the run folder that says what was ingested and how.
pub(crate) const FILE: &str = "ingest.json";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cell's axis values: framework, model, dtype, GPUs, global batch, sequence length.
fn values(s: &IngestSettings, log: &Log, model: &ModelFlops) -> IndexMap<String, Value> {
    let mut v = IndexMap::new();
    v.insert("framework".into(), Value::Str(log.framework.name().into()));
    v.insert("model".into(), Value::Str(model.name.clone()));
    v.insert("dtype".into(), Value::Str(s.dtype.name().into()));
    v.insert("gpus".into(), Value::Int(i64::from(s.gpus)));
    v.insert("gbs".into(), Value::Str(format!("gbs{}", s.global_batch)));
    v.insert("seq".into(), Value::Str(format!("seq{}", s.seq_len)));
    v
}

/// What identifies the measurement setup besides the log: a change shows as a changed
/// "framework config" among a verdict's suspects.
fn parameters(s: &IngestSettings, model: &ModelFlops, peak: Option<&Peak>) -> String {
    format!(
        "model={} flops_per_token={:e} global_batch={} seq_len={} gpus={} dtype={} peak={} skip_steps={}",
        model.name,
        model.flops_per_token,
        s.global_batch,
        s.seq_len,
        s.gpus,
        s.dtype.name(),
        peak.map(|p| p.policy.as_str()).unwrap_or("none"),
        s.skip_steps
    )
}

/// The run id: `--run-id`, else `ingest-` and a digest of the cell and its steps, so the
/// same log ingested again replaces its run instead of counting twice.
fn run_id(s: &IngestSettings, cell: &CellId, log: &Log) -> String {
    if let Some(id) = &s.run_id {
        return id.clone();
    }
    let mut h = sha2::Sha256::new();
    h.update(cell.as_str().as_bytes());
    for st in &log.steps {
        h.update(
            format!(
                "{}:{}:{};",
                st.step,
                st.step_time_s,
                st.loss.unwrap_or(-1.0)
            )
            .as_bytes(),
        );
    }
    format!("ingest-{}", &hex(&h.finalize())[..12])
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The run document of the ingested run.
pub(crate) fn results(
    s: &IngestSettings,
    log: &Log,
    model: &ModelFlops,
    peak: Option<&Peak>,
    fig: &Figures,
) -> Result<RunResults, IngestError> {
    let values = values(s, log, model);
    let id = match &s.cell {
        Some(c) => {
            if crate::cell::sanitize(c) != *c || c.starts_with('.') {
                return Err(IngestError::Args(format!(
                    "--cell {c}: a cell id is made of A-Z a-z 0-9 . _ + - (it names files), and does not start with a dot"
                )));
            }
            CellId(c.clone())
        }
        None => CellId::from_values(&values),
    };
    let gpu_model = match &s.peak {
        PeakSource::Gpu(g) => super::figures::gpu_name(g).map(str::to_string),
        _ => None,
    };
    let hardware_key = s.hardware_key.clone().unwrap_or_else(|| match &gpu_model {
        Some(g) => crate::env::gpu_hardware_key(g, None),
        None => "unknown-gpu".into(),
    });
    let (git_commit, git_dirty) = crate::env::git_state(Path::new("."));
    let params_text = parameters(s, model, peak);
    let tokens = fig.tokens_per_step;
    // Every logged step with its loss when the framework prints one per step; a
    // framework that prints none (Paxml, DeepSpeed's timer) gives its figures through the
    // summary, and its step times are in ingest.json: a loss bench would have to invent
    // is not recorded.
    let with_loss = log.steps.iter().all(|st| st.loss.is_some());
    let steps: Vec<StepEvent> = if with_loss {
        log.steps
            .iter()
            .enumerate()
            .map(|(i, st)| StepEvent {
                step: i as u64,
                step_time_s: st.step_time_s,
                tokens,
                loss: st.loss.unwrap_or_default(),
                warmup: Some(i < s.skip_steps),
                rank: log.rank,
            })
            .collect()
    } else {
        Vec::new()
    };
    let framework = crate::external::FrameworkReport {
        name: log.framework.name().into(),
        version: "unknown (an ingested log)".into(),
        libraries: Default::default(),
        config_file: s.logs.first().cloned().unwrap_or_default(),
        config_sha256: hex(&sha2::Sha256::digest(params_text.as_bytes())),
        tokens_per_s_per_gpu: fig.own.tokens_per_s_per_gpu,
        tflops_per_gpu: fig.own.tflops_per_gpu,
        mfu: fig.own.mfu,
        method: format!(
            "{}'s own figures as printed in its log, medians over the measured steps",
            log.framework.name()
        ),
    };
    let summary = SummaryEvent {
        tokens_per_s: Some(fig.tokens_per_s),
        tokens_per_s_per_gpu: Some(fig.tokens_per_s_per_gpu),
        step_time_s: Some(fig.step_time_s),
        tflops_per_gpu: Some(fig.tflops_per_gpu),
        mfu: fig.mfu,
        mfu_policy: peak.map(|p| p.policy.clone()),
        peak_mem_bytes: Vec::new(),
        n_params: model.n_params,
        flops_per_token: Some(model.flops_per_token),
        world_size: Some(s.gpus),
        final_loss: log.steps.last().and_then(|st| st.loss),
        time_to_first_step_s: None,
        device: gpu_model.clone(),
        framework: Some(Box::new(framework)),
        ran: None,
    };
    let notices = if with_loss {
        Vec::new()
    } else {
        vec![format!(
            "{} prints no loss per step: the step times are in {FILE}, the figures in the summary",
            log.framework.name()
        )]
    };
    let repeats = vec![Repeat {
        steps,
        summary,
        notices,
    }];
    let params = Params {
        steps: u32::try_from(log.steps.len()).unwrap_or(u32::MAX),
        warmup: u32::try_from(s.skip_steps).unwrap_or(u32::MAX),
        seq_len: u32::try_from(s.seq_len).unwrap_or(u32::MAX),
        micro_batch: 1,
        grad_accum: 1,
        global_batch: u32::try_from(s.global_batch).unwrap_or(u32::MAX),
        repeats: 1,
        retries: 0,
        ..Params::default()
    };
    let metrics = crate::metrics::stats::cell_metrics(&params, s.gpus, &repeats);
    let started = now();
    let cell = CellResult {
        id: id.clone(),
        values,
        params,
        outcome: Outcome::Passed,
        flaky: false,
        attempts: Vec::new(),
        repeats,
        metrics,
        logs: s.logs.clone(),
        duration_s: log.steps.iter().map(|st| st.step_time_s).sum(),
        telemetry: None,
    };
    Ok(RunResults {
        schema_version: crate::results::SCHEMA_VERSION,
        run_id: run_id(s, &id, log),
        matrix: s.logs.first().cloned().unwrap_or_default(),
        matrix_name: format!("ingest-{}", log.framework.name()),
        matrix_sha256: None,
        filters: Vec::new(),
        started_at: started.clone(),
        finished_at: Some(started),
        interrupted: false,
        interrupted_in: None,
        environment: Environment {
            gpu_model,
            gpu_count: s.gpus,
            gpu_memory_mib: None,
            driver: None,
            cuda: None,
            rocm: None,
            libtorch: None,
            nccl: None,
            cpu: String::new(),
            host: "ingested".into(),
            os: String::new(),
            git_commit,
            git_dirty,
            bench_version: env!("CARGO_PKG_VERSION").into(),
            hardware_key,
            switches: Default::default(),
        },
        environment_source: None,
        launcher: Some("ingest".into()),
        cells: vec![cell],
        dropped: Vec::new(),
    })
}

/// `ingest.json`: the inputs, formulas, steps and figures.
#[derive(serde::Serialize)]
struct Document<'a> {
    logs: &'a [std::path::PathBuf],
    framework: &'static str,
    reporting_rank: Option<u32>,
    other_ranks: &'a [u32],
    parameters: String,
    model: &'a ModelFlops,
    peak: Option<&'a str>,
    formulas: [&'static str; 5],
    figures: &'a Figures,
    skip_steps: usize,
    steps: Steps<'a>,
}

/// The steps of `ingest.json`, each naming its file by its index in the document's
/// `logs`: a path is written once, not once per step (a million steps under a
/// 3,000-character path were a 6 GB document, and bench aborted out of memory building
/// it). Nothing reads `ingest.json` back; it is for people and scripts.
struct Steps<'a> {
    logs: &'a [std::path::PathBuf],
    steps: &'a [super::parse::Step],
}

/// One step of `ingest.json`.
#[derive(serde::Serialize)]
struct StepRow<'a> {
    step: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    step_time_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    loss: Option<f64>,
    own: &'a super::parse::Own,
    /// The index of the step's file in `logs`.
    file: usize,
    line: usize,
}

impl serde::Serialize for Steps<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let names: Vec<String> = self.logs.iter().map(|p| p.display().to_string()).collect();
        let mut seq = s.serialize_seq(Some(self.steps.len()))?;
        // Steps come file by file: the index is looked up once per file.
        let mut last: Option<(&std::sync::Arc<str>, usize)> = None;
        for st in self.steps {
            let file = match last {
                Some((f, i)) if std::sync::Arc::ptr_eq(f, &st.file) => i,
                _ => {
                    let i = names
                        .iter()
                        .position(|n| **n == *st.file)
                        .ok_or_else(|| S::Error::custom(format!("{}: not a log given", st.file)))?;
                    last = Some((&st.file, i));
                    i
                }
            };
            seq.serialize_element(&StepRow {
                step: st.step,
                epoch: st.epoch,
                step_time_s: st.step_time_s,
                loss: st.loss,
                own: &st.own,
                file,
                line: st.line,
            })?;
        }
        seq.end()
    }
}

/// The figures as the terminal shows them, each with its formula.
fn render(
    s: &IngestSettings,
    log: &Log,
    model: &ModelFlops,
    peak: Option<&Peak>,
    f: &Figures,
    cell: &str,
) -> String {
    let mut out = format!(
        "ingest: {} log, {} step(s) read, {} measured (--skip-steps {}), cell {cell}\n",
        log.framework.name(),
        log.steps.len(),
        f.measured_steps,
        s.skip_steps
    );
    if log.untimed > 0 {
        out += &format!(
            "  {} step line(s) gave no time (the first of a log that is timed by intervals)\n",
            log.untimed
        );
    }
    if let Some(r) = log.rank {
        out += &format!("  steps of rank {r}");
        if !log.other_ranks.is_empty() {
            out += &format!(" (ranks {:?} also logged)", log.other_ranks);
        }
        out += "\n";
    }
    out += &format!(
        "  step time      {:.4} s (median of the measured steps)\n",
        f.step_time_s
    );
    out += &format!(
        "  tokens/s       {:.1} = {} x {} / {:.4}\n",
        f.tokens_per_s, s.global_batch, s.seq_len, f.step_time_s
    );
    out += &format!(
        "  tokens/s/GPU   {:.1} = tokens/s / {} GPUs\n",
        f.tokens_per_s_per_gpu, s.gpus
    );
    out += &format!(
        "  TFLOP/s/GPU    {:.1} = tokens/s/GPU x {:.4e} FLOPs/token ({})\n",
        f.tflops_per_gpu, model.flops_per_token, model.formula
    );
    match (f.mfu, peak) {
        (Some(m), Some(p)) => {
            out += &format!(
                "  MFU            {:.2}% = TFLOP/s/GPU / {}\n",
                m * 100.0,
                p.policy
            )
        }
        _ => out += "  MFU            not computed: give --gpu or --peak-tflops\n",
    }
    out += &format!(
        "  days to 1T     {:.2} = 1e12 / tokens/s / 86400\n  GPU-hours/1T   {:.0} = days x 24 x {} GPUs\n",
        f.days_per_1t_tokens, f.gpu_hours_per_1t_tokens, s.gpus
    );
    let own = &f.own;
    if own.tokens_per_s_per_gpu.is_some() || own.tflops_per_gpu.is_some() || own.mfu.is_some() {
        let show = |v: Option<f64>, scale: f64, unit: &str| {
            v.map(|x| format!("{:.1}{unit}", x * scale))
                .unwrap_or_else(|| "-".into())
        };
        out += &format!(
            "  {}'s own: tokens/s/GPU {}, TFLOP/s/GPU {}, MFU {}\n",
            log.framework.name(),
            show(own.tokens_per_s_per_gpu, 1.0, ""),
            show(own.tflops_per_gpu, 1.0, ""),
            show(own.mfu, 100.0, "%")
        );
    }
    out
}

/// The fewest measured steps whose later half can confirm a breach (two per half).
const MIN_CONFIRM_STEPS: usize = 4;

/// The confirmation of an ingested run. bench did not start the job and cannot start it
/// again, so the gate's re-run is the run's own later half: the cell measured again from
/// the second half of its measured steps (run id `<run>-confirm`, recorded as a confirming
/// re-run is). A breach the later half shows too held through the run; one it does not
/// show (a slow start, a transient) leaves the run unchanged. A log of fewer than
/// [`MIN_CONFIRM_STEPS`] measured steps gets no confirmation: a breach stays suspect until
/// the next run shows it too.
struct LaterHalf<'a> {
    s: &'a IngestSettings,
    log: &'a Log,
    model: &'a ModelFlops,
    peak: Option<&'a Peak>,
    run_id: String,
}

impl LaterHalf<'_> {
    /// A log has one later half: a second re-run would be the same steps again.
    const PASSES: usize = 1;

    /// The "re-run": the run measured again from the later half of its steps.
    fn rerun(&self) -> Result<ConfirmOutcome, CliError> {
        let measured = &self.log.steps[self.s.skip_steps..];
        let later = Log {
            steps: measured[measured.len() / 2..].to_vec(),
            ..self.log.clone()
        };
        let mut s = self.s.clone();
        s.skip_steps = 0;
        s.run_id = Some(format!("{}{CONFIRM_SUFFIX}", self.run_id));
        let fig = super::figures::compute(&s, &later, self.model, self.peak)?;
        eprintln!(
            "history: the confirmation of an ingested run is its later half: steps {}..{} ({} steps, median {:.4} s)",
            later.steps[0].step,
            later.steps[later.steps.len() - 1].step,
            later.steps.len(),
            fig.step_time_s
        );
        Ok(ConfirmOutcome {
            results: results(&s, &later, self.model, self.peak, &fig)?,
            interrupted: false,
        })
    }
}

/// Writes the run folder, records and judges the run (with `--history`), writes the
/// reports and returns the exit code (1 when the gate fails the run).
pub(crate) fn write_and_judge(
    s: &IngestSettings,
    log: &Log,
    model: &ModelFlops,
    peak: Option<&Peak>,
    fig: &Figures,
) -> Result<i32, CliError> {
    let results = results(s, log, model, peak, fig)?;
    let cell = results.cells[0].id.as_str().to_string();
    // A run id the store holds for another hardware is refused before anything is written.
    if let Some(location) = &s.history {
        crate::history::open(location)?
            .claim_run_id(&results.run_id, &results.environment.hardware_key)?;
    }
    let run_dir = s.results_dir.join(&results.run_id);
    std::fs::create_dir_all(&run_dir).map_err(|e| {
        CliError::internal(miette::miette!(
            "{}: cannot create the run folder: {e}",
            run_dir.display()
        ))
    })?;
    results.save_atomic(&run_dir)?;
    let doc = Document {
        logs: &s.logs,
        framework: log.framework.name(),
        reporting_rank: log.rank,
        other_ranks: &log.other_ranks,
        parameters: parameters(s, model, peak),
        model,
        peak: peak.map(|p| p.policy.as_str()),
        formulas: [
            "tokens_per_s = global_batch * seq_len / median step time",
            "tokens_per_s_per_gpu = tokens_per_s / gpus",
            "tflops_per_gpu = tokens_per_s_per_gpu * flops_per_token / 1e12",
            "mfu = tflops_per_gpu / peak dense TFLOP/s of one GPU for the dtype",
            "days_per_1t_tokens = 1e12 / tokens_per_s / 86400; gpu_hours_per_1t_tokens = days * 24 * gpus",
        ],
        figures: fig,
        skip_steps: s.skip_steps,
        steps: Steps {
            logs: &s.logs,
            steps: &log.steps,
        },
    };
    let json =
        serde_json::to_vec_pretty(&doc).map_err(|e| CliError::internal(miette::miette!("{e}")))?;
    crate::atomic::write(&run_dir.join(FILE), &json).map_err(|e| {
        CliError::internal(miette::miette!("{}: {e}", run_dir.join(FILE).display()))
    })?;
    if s.format == crate::format::Format::Human {
        let text = render(s, log, model, peak, fig, &cell);
        let _ = crate::exit::write_stdout(&text);
    }
    eprintln!("results: {}", run_dir.join(RunResults::FILE).display());
    if let Some(location) = &s.history {
        let mut store = crate::history::open(location)?;
        let measured = log.steps.len() - s.skip_steps;
        let later = LaterHalf {
            s,
            log,
            model,
            peak,
            run_id: results.run_id.clone(),
        };
        let passes = if measured >= MIN_CONFIRM_STEPS {
            LaterHalf::PASSES
        } else {
            0
        };
        let mut confirm = crate::history::gate::Confirmation::start(
            &mut store,
            &run_dir,
            &results,
            None,
            &s.baselines,
            passes,
            None,
        )?;
        while let Some((_, cells)) = confirm.next_rerun() {
            confirm.take(&cells, later.rerun())?;
        }
        confirm.finish()?;
    }
    let verdicts = crate::judge::of_run(&results, &s.baselines, Some(&run_dir))?;
    let findings = crate::triage::findings(&results, &verdicts);
    crate::report::finish_run(
        &run_dir, &results, &verdicts, &findings, s.format, false, None,
    )
}
