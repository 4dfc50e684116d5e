//! External training frameworks as workloads: torchtitan, the Hugging Face Trainer,
//! Megatron-Core, DeepSpeed, MaxText and llm.c.
//!
//! This stage owns everything between a framework cell and the runner's worker events:
//! which combinations a framework can express (the rest is dropped at expansion with the
//! adapter's reason, like a rule), the mapping of bench's axes and parameters to the
//! framework's own config file and flags, the launch (torchrun), and the translation of the
//! framework's log lines into the same [`crate::events::Event`] stream the built-in worker
//! prints. A framework cell runs as `bench adapt --cell JSON` ([`run`]): that process writes
//! the framework's config into the run folder, starts the framework in the cell's process
//! group, echoes its log, and prints step and summary events parsed from it. bench computes
//! FLOPs per token and MFU itself from the model preset ([`crate::metrics::flops`]), and
//! keeps the framework's own tokens/s, TFLOP/s and MFU beside them ([`FrameworkReport`]).
//!
//! What an adapter can express and how it starts its framework are declared tables
//! ([`capability::Capabilities`], [`launch::Launch`], side by side in [`declared`]) read by
//! shared code; what is left per adapter is the framework's own config ([`Adapter::config`])
//! and its own log lines ([`log::StepLines`]).
//!
//! Adding a framework: its tables in [`declared`], one file implementing [`Adapter`]
//! (config, log lines) and one line in [`ADAPTERS`]; docs/frameworks.md walks through it.

pub(crate) mod bounds;
pub(crate) mod capability;
pub(crate) mod declared;
pub mod deepspeed;
pub mod hf;
pub(crate) mod launch;
pub mod llmc;
pub mod log;
pub mod maxtext;
pub mod megatron;
pub(crate) mod ran;
pub mod run;
pub mod torchtitan;

use std::path::{Path, PathBuf};

use crate::cell::{Cell, Value, Workload};
use crate::workload::models::presets::{self, Family, ModelConfig};

pub use crate::cell::FrameworkOpts;
pub use crate::events::FrameworkReport;

/// A framework config file and command line for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prepared {
    /// The file's extension (`toml`, `json`) and text.
    pub config_ext: &'static str,
    pub config_text: String,
    /// The command line; `{config}` in an element is the config file's path.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Further files the framework reads (e.g. generated data), written before it starts.
    pub files: Vec<(PathBuf, Vec<u8>)>,
}

/// A framework's config file for one attempt, as its adapter writes it; the launch
/// ([`launch::Launch`]) adds the command line around it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    /// The file's extension (`toml`, `json`) and text.
    pub ext: &'static str,
    pub text: String,
    /// Environment the driver needs beyond the launch's.
    pub env: Vec<(String, String)>,
    /// Further files the framework reads (e.g. generated data), written before it starts.
    pub files: Vec<(PathBuf, Vec<u8>)>,
}

impl Config {
    /// A JSON config (pretty-printed, as the drivers read it and a person reads the run
    /// folder).
    pub(crate) fn json(config: &serde_json::Value) -> Config {
        Config {
            ext: "json",
            text: serde_json::to_string_pretty(config).unwrap_or_default() + "\n",
            env: vec![],
            files: vec![],
        }
    }
}

/// Where an attempt's files go and what the adapter may use.
#[derive(Debug, Clone)]
pub(crate) struct AttemptFiles {
    /// The attempt's own folder inside the run folder (config, data, framework outputs).
    pub dir: PathBuf,
    /// The folder holding the adapters' Python drivers (`scripts/frameworks`).
    pub scripts: PathBuf,
    pub python: String,
}

/// One framework as bench knows it: what its adapter declares as data (its name, what it
/// can express, how it starts, which of its log lines say what ran) and the adapter's code
/// (the config it writes, the log lines it reads).
pub(crate) struct Framework {
    /// The workload kind, e.g. `torchtitan`.
    pub name: &'static str,
    pub capabilities: capability::Capabilities,
    pub launch: launch::Launch,
    /// The framework's log lines that say what ran (compile, attention, checkpointing,
    /// optimizer, precision, parallelism): the record of [`ran`].
    pub signatures: &'static [ran::Signature],
    /// Whether the framework runs on torch (so torch's own warnings, such as dynamo's
    /// recompile limit, speak for it too).
    pub torch_based: bool,
    pub adapter: &'static dyn Adapter,
}

/// The code of one framework's adapter: what is not data.
pub(crate) trait Adapter: Sync {
    /// The framework's config for `cell`.
    fn config(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Config;
    /// A fresh parser of the framework's log for `cell`.
    fn parser(&self, cell: &Cell) -> Box<dyn log::LogParser>;
    /// Why the framework cannot run `cell` for a reason that is no table data (the table's
    /// `further` says it in words); checked after the table.
    fn refuses(&self, _cell: &Cell) -> Option<String> {
        None
    }
}

impl Framework {
    /// The workload kind, e.g. `torchtitan`.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Why the framework cannot run `cell` as bench means it, if it cannot: its table, then
    /// [`Adapter::refuses`].
    pub(crate) fn unexpressible(&self, cell: &Cell) -> Option<String> {
        capability::check(&self.capabilities, cell).or_else(|| self.adapter.refuses(cell))
    }

    /// The framework's config ([`Adapter::config`]) and command line for `cell`.
    pub(crate) fn prepare(
        &self,
        cell: &Cell,
        opts: &FrameworkOpts,
        files: &AttemptFiles,
    ) -> Prepared {
        let config = self.adapter.config(cell, opts, files);
        let mut env = self.launch.env(opts);
        env.extend(config.env);
        Prepared {
            config_ext: config.ext,
            config_text: config.text,
            argv: self.launch.command(cell, opts, files),
            env,
            files: config.files,
        }
    }

    /// A fresh parser of the framework's log for `cell` ([`Adapter::parser`]).
    pub(crate) fn parser(&self, cell: &Cell) -> Box<dyn log::LogParser> {
        self.adapter.parser(cell)
    }

    /// The log lines that say what ran ([`Framework::signatures`]).
    pub(crate) fn signatures(&self) -> &'static [ran::Signature] {
        self.signatures
    }

    /// Whether the framework runs on torch ([`Framework::torch_based`]).
    pub(crate) fn torch_based(&self) -> bool {
        self.torch_based
    }
}

/// Every framework bench knows, by the name a matrix's `workload: {kind: ...}` gives.
/// Adding a framework is one file declaring its [`Framework`] and one line here.
pub(crate) static ADAPTERS: &[&Framework] = &[
    &declared::TORCHTITAN,
    &declared::HF,
    &declared::MEGATRON,
    &declared::DEEPSPEED,
    &declared::MAXTEXT,
    &declared::LLMC,
];

/// The framework called `kind`.
pub(crate) fn find(kind: &str) -> Option<&'static Framework> {
    ADAPTERS.iter().copied().find(|a| a.name() == kind)
}

/// The names of the known adapters, in registry order (for error messages).
pub(crate) fn names() -> Vec<&'static str> {
    ADAPTERS.iter().map(|a| a.name()).collect()
}

/// The adapter of a workload, `None` for built-in and command workloads and for a
/// framework kind no adapter has (refused when the matrix is loaded).
pub(crate) fn adapter(w: &Workload) -> Option<(&'static Framework, &FrameworkOpts)> {
    match w {
        Workload::Framework { kind, opts } => find(kind).map(|a| (a, opts)),
        Workload::Builtin | Workload::Command { .. } => None,
    }
}

/// `(by, reason)` when `cell` is a framework cell its framework cannot express: the
/// expansion drops it, as a rule would.
pub(crate) fn unexpressible(cell: &Cell) -> Option<(String, String)> {
    let (a, _) = adapter(&cell.params.workload)?;
    a.unexpressible(cell)
        .map(|why| (format!("workload {}", a.name()), why))
}

/// The `bench` arguments that run a framework cell (`bench adapt --cell JSON`).
pub(crate) fn adapt_args(cell: &Cell) -> Vec<String> {
    // Serialising a cell cannot fail: its maps have string keys.
    let json = serde_json::to_string(cell).unwrap_or_default();
    vec!["adapt".to_string(), "--cell".to_string(), json]
}

/// The Llama preset a framework cell trains, or why there is none.
pub(crate) fn llama_preset(cell: &Cell, framework: &str) -> Result<ModelConfig, String> {
    let name = cell.model();
    let cfg = presets::get(name).ok_or_else(|| {
        format!("model `{name}` is not a bench preset, so {framework} cannot be given its shape")
    })?;
    if cfg.family != Family::Llama || cfg.qkv_bias {
        return Err(format!(
            "{framework} adapter builds Llama-3-style models only; `{name}` is not one"
        ));
    }
    Ok(cfg)
}

/// The Llama preset an expressible cell trains, for an adapter's mapping (`llama-tiny` for
/// a cell its table would have dropped, which is never prepared).
pub(crate) fn mapped_llama(cell: &Cell) -> ModelConfig {
    llama_preset(cell, "").unwrap_or_else(|_| presets::get("llama-tiny").expect("built-in preset"))
}

/// A cell's tensor-parallel degree and the data-parallel degrees beside it, as (tp,
/// replicated, sharded), for the frameworks that name all three (torchtitan, MaxText): `ddp`
/// replicates the model over the data-parallel ranks; `single` and `fsdp` shard it (over
/// one rank: plain training).
pub(crate) fn parallel_degrees(cell: &Cell) -> (u32, u32, u32) {
    let tp = degree(cell, "tp");
    let dp = cell.gpus() / tp.max(1);
    match cell.parallel() {
        crate::axes::Parallel::Ddp => (tp, dp, 1),
        _ => (tp, 1, dp),
    }
}

/// The bench preset a framework cell trains, of any family (each adapter's `unexpressible`
/// says which it can build), for FLOPs per token and the parameter count.
pub(crate) fn preset(cell: &Cell) -> Result<ModelConfig, String> {
    presets::get(cell.model())
        .ok_or_else(|| format!("model `{}` is not a bench preset", cell.model()))
}

/// An integer axis such as `tp` or `pp` (1 when the matrix has no such axis).
pub(crate) fn degree(cell: &Cell, axis: &str) -> u32 {
    cell.values
        .get(axis)
        .and_then(Value::as_f64)
        .map(|v| v.max(1.0) as u32)
        .unwrap_or(1)
}

/// Checks every adapter shares: known features, a warm-up that excludes the first step
/// (whose time includes start-up), and a global batch the data-parallel ranks divide.
pub(crate) fn common_checks(cell: &Cell, framework: &str, features: &[&str]) -> Option<String> {
    let p = &cell.params;
    if let Some(f) = cell
        .features()
        .into_iter()
        .find(|f| !features.contains(&f.as_str()))
    {
        return Some(if features.is_empty() {
            format!("{framework} adapter maps no features, not `{f}`")
        } else {
            format!(
                "{framework} adapter maps features {} only, not `{f}`",
                features.join(", ")
            )
        });
    }
    if cell.parallel().name() == "single" && cell.gpus() > 1 {
        return Some(format!(
            "parallel single runs one rank; {} GPUs need ddp or fsdp",
            cell.gpus()
        ));
    }
    if p.warmup < 1 {
        return Some(
            "warmup must be at least 1: a framework's first logged step includes its start-up"
                .into(),
        );
    }
    if p.steps <= p.warmup {
        return Some(format!(
            "steps ({}) must exceed warmup ({}) so that some step is measured",
            p.steps, p.warmup
        ));
    }
    let model_parallel = degree(cell, "tp") * degree(cell, "pp");
    if !cell.gpus().is_multiple_of(model_parallel) {
        return Some(format!(
            "tp x pp ({model_parallel}) does not divide gpus ({})",
            cell.gpus()
        ));
    }
    let dp = cell.gpus() / model_parallel;
    if p.global_batch != dp * p.micro_batch * p.grad_accum {
        return Some(format!(
            "global_batch {} is not data-parallel ranks ({dp}) x micro_batch ({}) x grad_accum ({})",
            p.global_batch, p.micro_batch, p.grad_accum
        ));
    }
    None
}

/// The folder of the adapters' Python drivers: `$BENCH_FRAMEWORK_SCRIPTS`, else
/// `scripts/frameworks` under the current folder, else beside the executable's checkout
/// (`target/<profile>/bench` -> `scripts/frameworks`).
pub(crate) fn scripts_dir(exe: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os("BENCH_FRAMEWORK_SCRIPTS") {
        return PathBuf::from(d);
    }
    let here = PathBuf::from("scripts/frameworks");
    if here.is_dir() {
        return here;
    }
    exe.ancestors()
        .map(|a| a.join("scripts/frameworks"))
        .find(|p| p.is_dir())
        .unwrap_or(here)
}

/// The interpreter of a framework workload.
pub(crate) fn python(opts: &FrameworkOpts) -> String {
    opts.python
        .clone()
        .or_else(|| std::env::var("BENCH_PYTHON").ok())
        .unwrap_or_else(|| "python3".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellId, Params};
    use indexmap::IndexMap;

    /// An attempt's files as the adapters' mapping tests give them.
    pub(crate) fn files() -> AttemptFiles {
        AttemptFiles {
            dir: "/r/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        }
    }

    /// What a cell of `steps` steps of `global_batch` sequences of `seq_len` tokens on
    /// `gpus` GPUs asks of its framework's log.
    pub(crate) fn asked(steps: u32, global_batch: u32, seq_len: u32, gpus: u32) -> log::Asked {
        log::Asked {
            steps,
            global_batch,
            seq_len,
            gpus,
        }
    }

    /// The text of `tests/fixtures/frameworks/<name>`.
    pub(crate) fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// A `llama-tiny` bf16 cell of framework `kind`.
    pub(crate) fn tiny_cell(kind: &str, gpus: i64, parallel: &str, feats: &[&str]) -> Cell {
        framework_cell(kind, "llama-tiny", "bf16", gpus, parallel, feats)
    }

    /// [`cell`] as a cell of framework `kind`.
    pub(crate) fn framework_cell(
        kind: &str,
        model: &str,
        dtype: &str,
        gpus: i64,
        parallel: &str,
        feats: &[&str],
    ) -> Cell {
        let mut c = cell(model, dtype, gpus, parallel, feats);
        c.params.workload = Workload::framework(kind);
        c
    }

    pub(crate) fn cell(
        model: &str,
        dtype: &str,
        gpus: i64,
        parallel: &str,
        feats: &[&str],
    ) -> Cell {
        let mut values = IndexMap::new();
        values.insert("model".to_string(), Value::Str(model.into()));
        values.insert("dtype".to_string(), Value::Str(dtype.into()));
        values.insert("gpus".to_string(), Value::Int(gpus));
        values.insert("parallel".to_string(), Value::Str(parallel.into()));
        values.insert(
            "features".to_string(),
            Value::Set(feats.iter().map(|s| s.to_string()).collect()),
        );
        let params = Params {
            steps: 10,
            warmup: 2,
            seq_len: 256,
            micro_batch: 2,
            grad_accum: 1,
            global_batch: 2 * gpus as u32,
            workload: Workload::framework("torchtitan"),
            ..Params::default()
        };
        Cell {
            id: CellId::from_values(&values),
            values,
            params,
        }
    }

    #[test]
    fn common_checks_name_what_cannot_run() {
        let ok = cell("llama-tiny", "bf16", 2, "fsdp", &["compile"]);
        assert_eq!(common_checks(&ok, "x", &["compile", "sac"]), None);
        let bad = cell("llama-tiny", "bf16", 2, "single", &[]);
        assert!(common_checks(&bad, "x", &[])
            .unwrap()
            .contains("ddp or fsdp"));
        let bad = cell("llama-tiny", "bf16", 1, "single", &["cudagraph"]);
        assert!(common_checks(&bad, "x", &["compile"])
            .unwrap()
            .contains("cudagraph"));
        let mut bad = cell("llama-tiny", "bf16", 2, "ddp", &[]);
        bad.params.global_batch = 3;
        assert!(common_checks(&bad, "x", &[])
            .unwrap()
            .contains("global_batch 3"));
        let mut bad = cell("llama-tiny", "bf16", 1, "single", &[]);
        bad.params.warmup = 0;
        assert!(common_checks(&bad, "x", &[]).unwrap().contains("warmup"));
    }

    #[test]
    fn presets_must_be_llama() {
        assert!(llama_preset(&cell("llama-tiny", "bf16", 1, "single", &[]), "t").is_ok());
        let e = llama_preset(&cell("gpt2-125m", "bf16", 1, "single", &[]), "t").unwrap_err();
        assert!(e.contains("Llama"), "{e}");
        let e = llama_preset(&cell("nope", "bf16", 1, "single", &[]), "t").unwrap_err();
        assert!(e.contains("not a bench preset"), "{e}");
    }

    #[test]
    fn workload_yaml_shape() {
        let w: Workload =
            serde_saphyr::from_str("{kind: torchtitan, python: /usr/bin/python3, args: [--x]}")
                .unwrap();
        let (a, o) = adapter(&w).unwrap();
        assert_eq!(a.name(), "torchtitan");
        assert_eq!(o.python.as_deref(), Some("/usr/bin/python3"));
        assert_eq!(o.args, vec!["--x"]);
        assert!(serde_saphyr::from_str::<Workload>("{kind: hf, nope: 1}").is_err());
        assert_eq!(
            serde_saphyr::from_str::<Workload>("{kind: hf}").unwrap(),
            Workload::framework("hf")
        );
        // The keys of one kind are refused on another.
        let e = serde_saphyr::from_str::<Workload>("{kind: hf, argv: [x]}").unwrap_err();
        assert!(
            e.to_string().contains("`hf` workload takes no `argv`"),
            "{e}"
        );
        let e = serde_saphyr::from_str::<Workload>("{kind: command, python: x, argv: [y]}")
            .unwrap_err();
        assert!(e.to_string().contains("takes no `python`"), "{e}");
        assert!(serde_saphyr::from_str::<Workload>("{kind: command}").is_err());
        // An unknown kind parses (the registry, not the cell type, knows the names) and has
        // no adapter; matrix loading refuses it with the known names.
        let w = serde_saphyr::from_str::<Workload>("{kind: nemo}").unwrap();
        assert!(adapter(&w).is_none());
    }

    #[test]
    fn workloads_serialize_as_before() {
        // results.json of earlier versions wrote these shapes; they read back, and are
        // written the same way again.
        for json in [
            r#"{"kind":"builtin"}"#,
            r#"{"kind":"command","argv":["x","{model}"],"env":{}}"#,
            r#"{"kind":"torchtitan","tokenizer":"t","args":["--a"]}"#,
            r#"{"kind":"hf"}"#,
        ] {
            let w: Workload = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::to_string(&w).unwrap(), json);
        }
    }

    #[test]
    fn registry_names_are_unique_and_found() {
        let names = names();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for n in &names {
            assert_eq!(find(n).unwrap().name(), *n);
        }
        assert!(names.len() >= 5, "{names:?}");
    }
}
