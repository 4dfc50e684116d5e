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

pub(crate) mod adapter;
pub(crate) mod bounds;
pub(crate) mod capability;
pub(crate) mod declared;
pub mod deepspeed;
pub mod hf;
pub(crate) mod launch;
pub mod llmc;
pub mod log;
pub(crate) mod mapping;
pub mod maxtext;
pub mod megatron;
pub(crate) mod ran;
pub mod run;
pub mod torchtitan;

use crate::cell::{Cell, Workload};

pub use crate::cell::FrameworkOpts;
pub use crate::events::FrameworkReport;
pub(crate) use adapter::Framework;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::Value;
    use crate::cell::{CellId, Params};
    use crate::external::launch::AttemptFiles;
    use crate::external::mapping::*;
    use indexmap::IndexMap;

    /// An attempt's files as the adapters' mapping tests give them.
    pub(crate) fn files() -> AttemptFiles {
        AttemptFiles {
            dir: "/r/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        }
    }

    /// What `framework` prepares for `cell`, which it must be able to run.
    pub(crate) fn prepared(framework: &adapter::Framework, cell: &Cell) -> adapter::Prepared {
        assert_eq!(framework.unexpressible(cell), None, "{}", cell.id);
        framework.prepare(cell, &crate::cell::FrameworkOpts::default(), &files())
    }

    /// What `framework` prepares for `cell` ([`prepared`]), with its JSON config parsed.
    pub(crate) fn config_json(
        framework: &adapter::Framework,
        cell: &Cell,
    ) -> (adapter::Prepared, serde_json::Value) {
        let p = prepared(framework, cell);
        let config = serde_json::from_str(&p.config_text).unwrap();
        (p, config)
    }

    /// Asserts that `framework` refuses to run `cell`, saying `why`.
    pub(crate) fn refuses_cell(framework: &adapter::Framework, cell: &Cell, why: &str) {
        let got = framework.unexpressible(cell).unwrap_or_default();
        assert!(got.contains(why), "{}: {got}", cell.id);
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
    fn every_driver_is_told_the_cells_warm_up() {
        // The drivers trace the last warm-up step under BENCH_PROFILE; each adapter's
        // launch carries the count, outside the config file.
        let files = files();
        for a in ADAPTERS {
            let model = if a.name() == "llmc" {
                "gpt2-125m"
            } else {
                "llama-tiny"
            };
            let mut c = framework_cell(a.name(), model, "bf16", 1, "single", &[]);
            c.params.warmup = 3;
            let p = a.prepare(&c, &FrameworkOpts::default(), &files);
            assert!(
                p.env
                    .contains(&(adapter::WARMUP_ENV.to_string(), "3".to_string())),
                "{}: {:?}",
                a.name(),
                p.env
            );
            assert!(!p.config_text.contains("BENCH_WARMUP"), "{}", a.name());
        }
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
