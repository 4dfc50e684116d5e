//! The matrix file's types (serde + schemars): what a user may write, and nothing else.
//!
//! `schema/matrix.schema.json` is generated from these types (`bench schema`), so the doc
//! comments here are what editors show as hover help. Semantics (expansion order, rule
//! kinds, include) are documented in docs/matrix.md.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cell::{Params, Value, Workload};

/// A benchmark matrix.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "bench matrix")]
pub struct MatrixSpec {
    /// Name used in reports and baseline comments (default: the file stem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Named axes in order; the cartesian product of their values gives the cells. Well-known
    /// axes: `model`, `dtype` (fp32 | bf16 | fp8), `gpus`, `parallel` (single | ddp | fsdp),
    /// `features` (sets of flags: compile, sac). An axis named like a parameter (e.g.
    /// `seq_len`) sets that parameter. Users may add axes of their own.
    pub axes: IndexMap<String, AxisSpec>,
    /// Groups of axes that advance in lockstep instead of forming a product, e.g.
    /// `[[gpus, global_batch]]`. Axes of a group must have the same number of values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zip: Vec<Vec<String>>,
    /// Parameters of every cell.
    #[serde(default)]
    pub defaults: ParamsPatch,
    /// Parameters per axis value, e.g. `model: {gpt2-1.5b: {micro_batch: 8}}`. Applied after
    /// `defaults`, in axis order (a later axis wins).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub overrides: IndexMap<String, IndexMap<String, ParamsPatch>>,
    /// Exclusions, applied in order to the product; the first matching rule drops a cell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// GitHub Actions `include` semantics, applied after the rules: an entry extends every
    /// cell its original-axis keys match (never overwriting an original value); an entry that
    /// matches no cell adds a new one. Keys naming parameters set parameters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<IndexMap<String, Value>>,
    /// Slurm settings for `--launcher slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSpec>,
    /// Automatic triage of a run judged against a history (`--history`): how to build a
    /// commit and how many GPU-seconds the bisection of a regression's commit range may
    /// take; `--triage-*` flags override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triage: Option<TriageSpec>,
}

/// The values of one axis.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AxisSpec {
    /// An explicit list: scalars (`[bf16, fp8]`), or, for a set-valued axis, lists of flags
    /// (`[[], [compile], [compile, sac]]`).
    Values(Vec<Value>),
    /// Every subset of these flags, smallest first: `{subsets_of: [compile, sac]}` gives
    /// `[], [compile], [sac], [compile, sac]`.
    Subsets(SubsetsSpec),
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubsetsSpec {
    pub subsets_of: Vec<String>,
}

/// A duration: seconds as a number, or text such as `90s`, `20m`, `1h30m`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum DurationSpec {
    Seconds(u64),
    Text(String),
}

impl DurationSpec {
    pub(crate) fn seconds(&self) -> Result<u64, String> {
        match self {
            DurationSpec::Seconds(s) => Ok(*s),
            DurationSpec::Text(t) => humantime::parse_duration(t)
                .map(|d| d.as_secs())
                .map_err(|e| format!("`{t}` is not a duration ({e}); write e.g. 90s, 20m, 1h30m")),
        }
    }
}

/// Parameters; every field optional so that layers (defaults, overrides, include) patch
/// each other.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamsPatch {
    /// Training steps, warm-up included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Leading steps excluded from measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u32>,
    /// Sequences per GPU per micro-step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_accum: Option<u32>,
    /// Sequences per optimizer step; derived as gpus x micro_batch x grad_accum unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch: Option<u32>,
    /// Measurements of the cell; their spread is its noise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u32>,
    /// Wall-clock limit of one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// Retries after infrastructure failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Checkpoint every k-th block when the `sac` feature is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sac_every: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Relative tolerance (e.g. 0.03) of the cells' throughput and time metrics, recorded in
    /// their baselines by `bench baseline update` unless the baseline file sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// Token file (.bin of uint16 or uint32 tokens); synthetic tokens when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// What runs: `{kind: builtin}` (default), `{kind: command, argv: [...], env: {...}}`, or
    /// a framework adapter: `{kind: torchtitan | hf, python: ..., args: [...]}` (docs/frameworks.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// Parameters of your own, available to command templates as `{name}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Names of the parameters that axes and include entries may set.
pub(crate) const PARAM_NAMES: &[&str] = &[
    "steps",
    "warmup",
    "seq_len",
    "micro_batch",
    "grad_accum",
    "global_batch",
    "repeats",
    "timeout",
    "retries",
    "sac_every",
    "seed",
    "lr",
    "tolerance",
    "data",
];

/// What the builder knows about how a cell's params were produced, for derived values.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Explicit {
    pub global_batch: bool,
    pub grad_accum: bool,
}

impl ParamsPatch {
    /// Applies this patch on top of `p`; errors name the offending key.
    pub(crate) fn apply(
        &self,
        p: &mut Params,
        explicit: &mut Explicit,
    ) -> Result<(), (String, String)> {
        macro_rules! set {
            ($($f:ident),*) => {$(
                if let Some(v) = &self.$f { p.$f = v.clone(); }
            )*};
        }
        set!(
            steps,
            warmup,
            seq_len,
            micro_batch,
            repeats,
            retries,
            sac_every,
            seed,
            lr
        );
        if let Some(g) = self.grad_accum {
            p.grad_accum = g;
            explicit.grad_accum = true;
        }
        if let Some(g) = self.global_batch {
            p.global_batch = g;
            explicit.global_batch = true;
        }
        if let Some(t) = &self.timeout {
            p.timeout_s = t.seconds().map_err(|e| ("timeout".to_string(), e))?;
        }
        if let Some(t) = self.tolerance {
            if !(t.is_finite() && t >= 0.0) {
                return Err((
                    "tolerance".to_string(),
                    format!("tolerance must be a non-negative fraction such as 0.03, not {t}"),
                ));
            }
            p.tolerance = Some(t);
        }
        if let Some(d) = &self.data {
            p.data = Some(d.clone());
        }
        if let Some(w) = &self.workload {
            p.workload = w.clone();
        }
        for (k, v) in &self.extra {
            p.extra.insert(k.clone(), v.clone());
        }
        Ok(())
    }
}

/// Sets parameter `name` from an axis or include value.
pub(crate) fn set_param(
    p: &mut Params,
    explicit: &mut Explicit,
    name: &str,
    value: &Value,
) -> Result<(), String> {
    fn uint(name: &str, v: &Value) -> Result<u64, String> {
        match v {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            other => Err(format!(
                "`{name}` must be a non-negative integer, not `{}`",
                other.id_fragment()
            )),
        }
    }
    fn u32_of(name: &str, v: &Value) -> Result<u32, String> {
        u32::try_from(uint(name, v)?).map_err(|_| format!("`{name}` is too large"))
    }
    match name {
        "steps" => p.steps = u32_of(name, value)?,
        "warmup" => p.warmup = u32_of(name, value)?,
        "seq_len" => p.seq_len = u32_of(name, value)?,
        "micro_batch" => p.micro_batch = u32_of(name, value)?,
        "grad_accum" => {
            p.grad_accum = u32_of(name, value)?;
            explicit.grad_accum = true;
        }
        "global_batch" => {
            p.global_batch = u32_of(name, value)?;
            explicit.global_batch = true;
        }
        "repeats" => p.repeats = u32_of(name, value)?,
        "retries" => p.retries = u32_of(name, value)?,
        "sac_every" => p.sac_every = u32_of(name, value)?,
        "seed" => p.seed = uint(name, value)?,
        "timeout" => {
            p.timeout_s = match value {
                Value::Str(s) => DurationSpec::Text(s.clone()).seconds()?,
                other => uint(name, other)?,
            }
        }
        "lr" => {
            p.lr = value
                .as_f64()
                .ok_or_else(|| format!("`lr` must be a number, not `{}`", value.id_fragment()))?
        }
        "tolerance" => {
            let t = value
                .as_f64()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| {
                    format!(
                        "`tolerance` must be a non-negative fraction such as 0.03, not `{}`",
                        value.id_fragment()
                    )
                })?;
            p.tolerance = Some(t);
        }
        "data" => {
            p.data = Some(
                value
                    .as_str()
                    .ok_or_else(|| "`data` must be a file path".to_string())?
                    .to_string(),
            )
        }
        _ => return Err(format!("`{name}` is not a parameter")),
    }
    Ok(())
}

/// The value of a parameter by name, for filters and rules (`seq_len>=4096`).
pub(crate) fn param_value(p: &Params, name: &str) -> Option<Value> {
    let v = match name {
        "steps" => Value::Int(p.steps.into()),
        "warmup" => Value::Int(p.warmup.into()),
        "seq_len" => Value::Int(p.seq_len.into()),
        "micro_batch" => Value::Int(p.micro_batch.into()),
        "grad_accum" => Value::Int(p.grad_accum.into()),
        "global_batch" => Value::Int(p.global_batch.into()),
        "repeats" => Value::Int(p.repeats.into()),
        "retries" => Value::Int(p.retries.into()),
        "sac_every" => Value::Int(p.sac_every.into()),
        "seed" => Value::Int(p.seed as i64),
        "timeout" => Value::Int(p.timeout_s as i64),
        "lr" => Value::Float(p.lr),
        "tolerance" => Value::Float(p.tolerance?),
        "data" => Value::Str(p.data.clone()?),
        other => match p.extra.get(other)? {
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64()?),
            },
            _ => return None,
        },
    };
    Some(v)
}

/// One exclusion rule. Exactly one of `exclude`, `when`, `incompatible`, `requires`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Optional short name shown with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Why the dropped cells cannot or should not run (required; shown in every report).
    pub reason: String,
    /// Partial match, as GitHub Actions `exclude`: drops every cell whose values equal all of
    /// these. A list for a scalar axis means any of its values; for a set-valued axis, a list
    /// is the exact flag set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<IndexMap<String, MatchValue>>,
    /// A filter expression (the `--filter` language); drops every cell it matches, e.g.
    /// `parallel=single and gpus>1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Flags that cannot run together, e.g. `[compile, fp8]`: drops every cell that has all
    /// of them. A flag is had when it is in a set-valued axis or is the value of any axis
    /// (so `fp8` matches `dtype: fp8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incompatible: Option<Vec<String>>,
    /// Drops cells that match `if` but not `then`, e.g. `{if: "has(sac)", then:
    /// "parallel=fsdp"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<Requires>,
}

impl Rule {
    /// The kind keyword, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match (
            &self.exclude,
            &self.when,
            &self.incompatible,
            &self.requires,
        ) {
            (Some(_), _, _, _) => "exclude",
            (_, Some(_), _, _) => "when",
            (_, _, Some(_), _) => "incompatible",
            (_, _, _, Some(_)) => "requires",
            _ => "rule",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Requires {
    #[serde(rename = "if")]
    pub if_: Selector,
    pub then: Selector,
}

/// Which cells: a filter expression, or a partial match like `exclude`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Selector {
    Expr(String),
    Match(IndexMap<String, MatchValue>),
}

/// A value to match in `exclude` and `requires`: one value, or a list of alternatives.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum MatchValue {
    One(Value),
    AnyOf(Vec<Value>),
}

/// Slurm settings (`--launcher slurm`); flags and `BENCH_SLURM_*` variables override them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Job time limit, e.g. `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<DurationSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// Extra sbatch arguments, e.g. `[--exclusive]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
}

/// Automatic triage (`triage:`): after a run judged against a history, a finding whose cause
/// is a commit range is bisected to its first bad commit on its cheapest cell, and one step
/// is traced at the last good and the first bad commit for the kernels that moved. Never in
/// a pull request's run (there the change is the pull request).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TriageSpec {
    /// GPU-seconds the run's bisections and traced steps may take together (every child's
    /// wall time, setup included, times the cell's GPUs); 0 turns automatic bisection off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_gpu_s: Option<f64>,
    /// Run through `sh -c` in a worktree at each probed commit before it is measured
    /// (install, build), as `bench bisect --setup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// The executable that runs built-in cells at a probed commit, relative to the worktree
    /// (the commit's own build, made by `setup`), as `bench bisect --worker-exe`. Without
    /// it, a built-in cell is not bisected: every commit would run this bench's workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<PathBuf>,
    /// The most repeats of one commit before it is called undecidable (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<usize>,
    /// Every run traces one step of each cell (`BENCH_PROFILE`; the built-in workload traces
    /// its last warm-up step) and keeps the step's kernel summary in the history, so that a
    /// regression with no bisection (a switch or version change, a pull request) gets the
    /// kernels that moved since its last good run. As `--trace-kernels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_every_run: Option<bool>,
}

/// The largest triage budget a matrix or `--triage-budget` may set: about 31 GPU-years.
/// More is a typo, and it would print as a number hundreds of digits long.
pub const MAX_TRIAGE_BUDGET_GPU_S: f64 = 1e9;

impl TriageSpec {
    /// What is wrong with the block's numbers (their types the parser has checked), as the
    /// key path and the message: the one check the matrix's load and the triage settings
    /// both apply.
    pub(crate) fn fault(&self) -> Option<(&'static str, String)> {
        if let Some(b) = self.budget_gpu_s {
            if !(b.is_finite() && (0.0..=MAX_TRIAGE_BUDGET_GPU_S).contains(&b)) {
                return Some((
                    "triage.budget_gpu_s",
                    format!(
                        "{b} is not a number of GPU-seconds from 0 to {MAX_TRIAGE_BUDGET_GPU_S:e}"
                    ),
                ));
            }
        }
        if self.max_repeats.is_some_and(|n| n < 2) {
            return Some((
                "triage.max_repeats",
                "at least 2 repeats are needed to tell two commits apart".to_string(),
            ));
        }
        None
    }
}

/// The JSON Schema of matrix files, pretty-printed with a trailing newline.
pub(crate) fn schema_json() -> String {
    let schema = schemars::schema_for!(MatrixSpec);
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_default();
    s.push('\n');
    s
}
