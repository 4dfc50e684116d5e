//! Cells: one point of an expanded matrix, with its stable id and resolved parameters.
//!
//! A [`Cell`] is what every later stage works on: the runner starts it, the results
//! record it, baselines are keyed by its [`CellId`], and reports name it. This module owns
//! the id rules (stable, filesystem-safe, derived from axis values in axis order) and the
//! mapping from a cell to the `bench worker` command line, so that the runner and the
//! built-in workload agree on one contract; [`command`] fills a `command` workload's
//! templates from a cell, for the runner and for the matrix's dry run alike.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::axes::{Dtype, Parallel};

pub(crate) mod command;

/// The value of one axis in one cell.
///
/// Scalars come straight from the matrix file; `Set` is the value of a set-valued axis
/// such as `features` (a set of flags like `compile` and `sac`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Set(BTreeSet<String>),
}

impl Value {
    /// The value as it appears in a cell id and in human output.
    ///
    /// Sets are written as their flags joined by `+` in sorted order, and the empty set as
    /// `base`, so that `{compile, sac}` and `{sac, compile}` give the same id.
    pub fn id_fragment(&self) -> String {
        self.fragment().into_owned()
    }

    /// [`Value::id_fragment`], borrowed when the value is a string: rules and filters
    /// compare fragments of every cell of the product, and a million cells should not
    /// cost a million copies of each string value.
    pub(crate) fn fragment(&self) -> Cow<'_, str> {
        match self {
            Value::Bool(b) => Cow::Owned(b.to_string()),
            Value::Int(i) => Cow::Owned(i.to_string()),
            Value::Float(f) => Cow::Owned(f.to_string()),
            Value::Str(s) => Cow::Borrowed(s),
            Value::Set(s) if s.is_empty() => Cow::Borrowed("base"),
            Value::Set(s) => Cow::Owned(s.iter().map(String::as_str).collect::<Vec<_>>().join("+")),
        }
    }

    /// The value as a number, when it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_set(&self) -> Option<&BTreeSet<String>> {
        match self {
            Value::Set(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id_fragment())
    }
}

/// A stable, filesystem-safe identifier of a cell, e.g.
/// `gpt2-125m.bf16.1gpu.single.compile+sac`.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct CellId(pub String);

impl CellId {
    /// Builds the id from axis values in axis order.
    ///
    /// The `gpus` axis is written as `<n>gpu` so that ids read naturally; every fragment is
    /// sanitised to `[A-Za-z0-9._+-]` (anything else becomes `_`) so that the id is safe as
    /// a file name on every platform. Fragments may contain `.` (`gpt2-1.5b`): ids are
    /// compared whole and never split, and the matrix rejects two cells with one id.
    pub fn from_values(values: &IndexMap<String, Value>) -> CellId {
        let parts: Vec<String> = values.iter().map(|(axis, v)| fragment(axis, v)).collect();
        CellId::join(parts.iter().map(String::as_str))
    }

    /// Joins fragments made by [`fragment`] into an id, as [`CellId::from_values`] does;
    /// expansion makes each axis value's fragment once and joins them for every cell.
    pub(crate) fn join<'f>(fragments: impl IntoIterator<Item = &'f str>) -> CellId {
        let mut id = String::new();
        for (i, f) in fragments.into_iter().enumerate() {
            if i > 0 {
                id.push('.');
            }
            id.push_str(f);
        }
        // A leading dot would make a hidden file (and `..` a parent directory).
        if id.starts_with('.') {
            id.replace_range(..1, "_");
        }
        CellId(id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// [`Cell::gpus`] of a cell whose `gpus` value is `v`.
pub(crate) fn gpus_of(v: Option<&Value>) -> u32 {
    v.and_then(Value::as_f64)
        .map(|g| g.max(1.0) as u32)
        .unwrap_or(1)
}

/// The part of a cell id that the value `v` of axis `axis` gives: `gpus` as `<n>gpu`, any
/// other value as its [`Value::id_fragment`], sanitised.
pub(crate) fn fragment(axis: &str, v: &Value) -> String {
    match (axis, v) {
        ("gpus", Value::Int(n)) => sanitize(&format!("{n}gpu")),
        _ => sanitize(&v.fragment()),
    }
}

/// Replaces every character outside `[A-Za-z0-9._+-]` with `_`; an empty fragment becomes `_`.
pub(crate) fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        "_".to_string()
    } else {
        out
    }
}

/// Options of a framework workload (`workload: {kind: torchtitan, ...}`); all optional.
///
/// Plain data owned by the cell, so that cells, results and matrix files do not depend on
/// the adapters that read it (`crate::external`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrameworkOpts {
    /// The Python interpreter that has the framework installed (default: `$BENCH_PYTHON`,
    /// else `python3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// A folder with a Hugging Face tokenizer (`tokenizer.json`); torchtitan needs one to
    /// build its data loader (its repository's `tests/assets/tokenizer` serves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// The framework's source tree, for frameworks that are built or run from a checkout:
    /// llm.c (where `make train_gpt2cu` builds), MaxText and Megatron-LM (put on
    /// `PYTHONPATH`). Default: the framework's `$BENCH_<NAME>_SOURCE` variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Extra arguments appended to the framework's command line (after bench's own, so
    /// they win), e.g. `[--training.gc_freq, "100"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables of the framework's processes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// What runs for a cell.
///
/// Written as `{kind: builtin}`, `{kind: command, argv: [...], env: {...}}`, or a framework
/// adapter's name with its options, e.g. `{kind: torchtitan, tokenizer: ...}`. A framework
/// kind is a plain string here: which names exist is the adapter registry's business
/// (`crate::external::ADAPTERS`), checked when a matrix is loaded, so that adding a
/// framework never touches this type.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "WorkloadSpec", into = "WorkloadSpec")]
pub enum Workload {
    /// The built-in libtorch workload: `bench worker` with arguments from the cell.
    #[default]
    Builtin,
    /// Any program that prints worker events as JSON lines. `argv` is a template: each
    /// element may contain `{axis}` or `{param}` placeholders filled from the cell. It is
    /// executed directly, never through a shell, so matrix values cannot inject commands.
    Command {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// A training framework run by its adapter under `bench adapt` (torchtitan, hf,
    /// megatron, deepspeed, maxtext, llmc; docs/frameworks.md has each one's mapping).
    Framework {
        /// The adapter's name, e.g. `torchtitan`.
        kind: String,
        opts: FrameworkOpts,
    },
}

/// A workload as matrix files and results write it: one flat object whose `kind` says which
/// of the other keys apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Workload")]
pub struct WorkloadSpec {
    /// `builtin`, `command`, or a framework adapter: `torchtitan`, `hf`, `megatron`,
    /// `deepspeed`, `maxtext`, `llmc` (docs/frameworks.md).
    pub kind: String,
    /// `command` only: the program and its arguments, with `{axis}`/`{param}` placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// `command` and frameworks: extra environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Frameworks: the Python interpreter that has the framework installed (default:
    /// `$BENCH_PYTHON`, else `python3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// torchtitan: a folder with a Hugging Face tokenizer (`tokenizer.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// llm.c, MaxText, Megatron-LM: the framework's source tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Frameworks: extra arguments appended to the framework's command line (they win).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

impl TryFrom<WorkloadSpec> for Workload {
    type Error = String;

    fn try_from(w: WorkloadSpec) -> Result<Self, String> {
        let framework_keys = [
            ("python", w.python.is_some()),
            ("tokenizer", w.tokenizer.is_some()),
            ("source", w.source.is_some()),
            ("args", w.args.is_some()),
        ];
        let refuse = |kind: &str, keys: &[(&str, bool)]| match keys.iter().find(|(_, set)| *set) {
            Some((k, _)) => Err(format!("a `{kind}` workload takes no `{k}`")),
            None => Ok(()),
        };
        match w.kind.as_str() {
            "builtin" => {
                refuse("builtin", &framework_keys)?;
                refuse(
                    "builtin",
                    &[("argv", w.argv.is_some()), ("env", w.env.is_some())],
                )?;
                Ok(Workload::Builtin)
            }
            "command" => {
                refuse("command", &framework_keys)?;
                let argv = w
                    .argv
                    .ok_or_else(|| "a `command` workload needs `argv`".to_string())?;
                Ok(Workload::Command {
                    argv,
                    env: w.env.unwrap_or_default(),
                })
            }
            "" => Err("the workload's `kind` is empty".to_string()),
            kind => {
                refuse(kind, &[("argv", w.argv.is_some())])?;
                Ok(Workload::Framework {
                    kind: kind.to_string(),
                    opts: FrameworkOpts {
                        python: w.python,
                        tokenizer: w.tokenizer,
                        source: w.source,
                        args: w.args.unwrap_or_default(),
                        env: w.env.unwrap_or_default(),
                    },
                })
            }
        }
    }
}

impl From<Workload> for WorkloadSpec {
    fn from(w: Workload) -> Self {
        let mut spec = WorkloadSpec {
            kind: w.kind().to_string(),
            argv: None,
            env: None,
            python: None,
            tokenizer: None,
            source: None,
            args: None,
        };
        match w {
            Workload::Builtin => {}
            // A command's environment was always written, empty or not; results keep that.
            Workload::Command { argv, env } => {
                spec.argv = Some(argv);
                spec.env = Some(env);
            }
            Workload::Framework { opts, .. } => {
                spec.python = opts.python;
                spec.tokenizer = opts.tokenizer;
                spec.source = opts.source;
                spec.args = Some(opts.args).filter(|a| !a.is_empty());
                spec.env = Some(opts.env).filter(|e| !e.is_empty());
            }
        }
        spec
    }
}

impl JsonSchema for Workload {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        WorkloadSpec::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        WorkloadSpec::json_schema(generator)
    }
}

impl Workload {
    /// The workload's kind as written in matrix files (`builtin`, `command`, `hf`, ...).
    pub fn kind(&self) -> &str {
        match self {
            Workload::Builtin => "builtin",
            Workload::Command { .. } => "command",
            Workload::Framework { kind, .. } => kind,
        }
    }

    /// A framework workload of `kind` with default options.
    pub fn framework(kind: &str) -> Workload {
        Workload::Framework {
            kind: kind.to_string(),
            opts: FrameworkOpts::default(),
        }
    }
}

/// Resolved per-cell parameters (defaults, then per-axis-value overrides, then derived
/// values such as `global_batch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Params {
    /// Training steps, warm-up included.
    pub steps: u32,
    /// Leading steps excluded from measurement.
    pub warmup: u32,
    /// Tokens per sequence.
    pub seq_len: u32,
    /// Sequences per GPU per micro-step.
    pub micro_batch: u32,
    /// Micro-steps per optimizer step.
    pub grad_accum: u32,
    /// Sequences per optimizer step across all GPUs (gpus x micro_batch x grad_accum
    /// unless set explicitly).
    pub global_batch: u32,
    /// How many times the cell is measured; the spread of repeats is its noise.
    pub repeats: u32,
    /// Wall-clock limit for one attempt of the cell, in seconds.
    pub timeout_s: u64,
    /// Retries for infrastructure failures (crash before any step, launch failure).
    pub retries: u32,
    /// Selective activation checkpointing: checkpoint every k-th block.
    pub sac_every: u32,
    /// Seed for synthetic data and initialisation.
    pub seed: u64,
    /// Learning rate of AdamW.
    pub lr: f64,
    /// Relative tolerance of this cell's throughput and time metrics, written into its
    /// baseline by `bench baseline update` (a tolerance already in the baseline file wins).
    /// None: the baseline store's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// Token file (.bin of uint16 or uint32) for real data; synthetic tokens when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// What runs.
    #[serde(default)]
    pub workload: Workload,
    /// User-defined parameters, available to command templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            steps: 30,
            warmup: 5,
            seq_len: 1024,
            micro_batch: 1,
            grad_accum: 1,
            global_batch: 1,
            repeats: 1,
            timeout_s: 1800,
            retries: 1,
            sac_every: 1,
            seed: 0,
            lr: 3e-4,
            tolerance: None,
            data: None,
            workload: Workload::Builtin,
            extra: BTreeMap::new(),
        }
    }
}

/// One cell of an expanded matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cell {
    pub id: CellId,
    /// Axis values in axis order (the order of `axes` in the matrix file, then axes that
    /// only `include` entries added).
    pub values: IndexMap<String, Value>,
    pub params: Params,
}

impl Cell {
    fn str_axis(&self, axis: &str) -> Option<&str> {
        self.values.get(axis).and_then(Value::as_str)
    }

    /// The model preset; `gpt2-125m` when the matrix has no `model` axis.
    pub(crate) fn model(&self) -> &str {
        self.str_axis("model").unwrap_or("gpt2-125m")
    }

    /// The dtype the matmuls run in; [`Dtype::default`] when the matrix has no `dtype` axis.
    /// Expansion refused values outside [`Dtype`], so the fallback only serves cells read
    /// back from results written before that check.
    pub(crate) fn dtype(&self) -> Dtype {
        self.str_axis("dtype")
            .and_then(|s| s.parse().ok())
            .unwrap_or_default()
    }

    /// GPUs the cell needs (world size); 1 when the matrix has no `gpus` axis. A CPU cell
    /// still has one rank.
    pub fn gpus(&self) -> u32 {
        gpus_of(self.values.get("gpus"))
    }

    /// The GPUs a worker's reported world size is held to: the cell's `gpus` as the
    /// matrix writes it, 0 for a CPU cell (`gpus: 0`, whose ranks are not GPUs), 1 when
    /// the matrix has no `gpus` axis (as [`Cell::gpus`]).
    pub(crate) fn world_gpus(&self) -> u32 {
        match self.values.get("gpus").and_then(Value::as_f64) {
            Some(g) if g <= 0.0 => 0,
            _ => self.gpus(),
        }
    }

    /// How the ranks share the work; [`Parallel::default`] when the matrix has no
    /// `parallel` axis (expansion refused values outside [`Parallel`]).
    pub(crate) fn parallel(&self) -> Parallel {
        self.str_axis("parallel")
            .and_then(|s| s.parse().ok())
            .unwrap_or_default()
    }

    /// The feature flags of the cell (empty when the matrix has no `features` axis).
    pub(crate) fn features(&self) -> BTreeSet<String> {
        self.values
            .get("features")
            .and_then(Value::as_set)
            .cloned()
            .unwrap_or_default()
    }

    /// The `bench worker` arguments for this cell (without the program name).
    ///
    /// This is the contract between the runner and the built-in workload: every flag here
    /// is accepted by `cli::WorkerArgs`, whose defaults for the axes are the same
    /// `axes` defaults a cell falls back to.
    pub(crate) fn worker_args(&self) -> Vec<String> {
        let p = &self.params;
        let mut args = vec![
            "--cell-id".to_string(),
            self.id.to_string(),
            "--model".to_string(),
            self.model().to_string(),
            "--dtype".to_string(),
            self.dtype().to_string(),
            "--parallel".to_string(),
            self.parallel().to_string(),
            "--steps".to_string(),
            p.steps.to_string(),
            "--warmup".to_string(),
            p.warmup.to_string(),
            "--seq-len".to_string(),
            p.seq_len.to_string(),
            "--micro-batch".to_string(),
            p.micro_batch.to_string(),
            "--grad-accum".to_string(),
            p.grad_accum.to_string(),
            "--sac-every".to_string(),
            p.sac_every.to_string(),
            "--seed".to_string(),
            p.seed.to_string(),
            "--lr".to_string(),
            p.lr.to_string(),
        ];
        let features = self.features();
        if !features.is_empty() {
            args.push("--features".to_string());
            args.push(features.into_iter().collect::<Vec<_>>().join(","));
        }
        if let Some(data) = &p.data {
            args.push("--data".to_string());
            args.push(data.clone());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_axis_order_and_filesystem_safe() {
        let mut v = IndexMap::new();
        v.insert("model".into(), Value::Str("gpt2-125m".into()));
        v.insert("dtype".into(), Value::Str("bf16".into()));
        v.insert("gpus".into(), Value::Int(1));
        v.insert("parallel".into(), Value::Str("single".into()));
        v.insert(
            "features".into(),
            Value::Set(["sac".to_string(), "compile".to_string()].into()),
        );
        assert_eq!(
            CellId::from_values(&v).as_str(),
            "gpt2-125m.bf16.1gpu.single.compile+sac"
        );
        v.insert("note".into(), Value::Str("a/b c:d".into()));
        assert!(CellId::from_values(&v).as_str().ends_with(".a_b_c_d"));
        let mut w = IndexMap::new();
        w.insert("x".to_string(), Value::Str("../etc".into()));
        assert_eq!(CellId::from_values(&w).as_str(), "_._etc");
    }

    #[test]
    fn empty_feature_set_is_base() {
        assert_eq!(Value::Set(BTreeSet::new()).id_fragment(), "base");
    }
}
