//! What every framework adapter is and produces: the [`Framework`] record that declares one
//! (its name, what it can express, how it starts, which of its log lines say what ran, and
//! its code), the [`Adapter`] trait that code implements, and the config and command line
//! of one attempt ([`Config`], [`Prepared`]). The registry of frameworks
//! (`external::ADAPTERS`) lives apart from this trait, so no adapter imports the file that
//! lists it.

use std::path::PathBuf;

use crate::cell::{Cell, FrameworkOpts};

use super::capability;
use super::launch::{self, AttemptFiles};
use super::log;
use super::ran;

/// The variable that gives a framework's driver the cell's warm-up step count.
pub(crate) const WARMUP_ENV: &str = "BENCH_WARMUP";

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

    /// The JSON config of a driver that runs the framework from a checkout (the workload's
    /// `source`): the cell's id, the `source`, then the adapter's own `keys` (an object),
    /// in that order, as every such driver reads them.
    pub(crate) fn from_source(
        cell: &Cell,
        opts: &FrameworkOpts,
        keys: serde_json::Value,
    ) -> Config {
        let mut config = serde_json::json!({
            "cell": cell.id.as_str(),
            "source": opts.source,
        });
        if let (Some(config), serde_json::Value::Object(keys)) = (config.as_object_mut(), keys) {
            config.extend(keys);
        }
        Config::json(&config)
    }
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
        // Under `BENCH_PROFILE` (triage's traced runs) the drivers trace the last warm-up
        // step, so that no measured step holds profiler work (scripts/frameworks/
        // step_trace.py); the cell's warm-up count tells them which framework step that is.
        // It is no part of the config file, so the config's hash stays that of the cell.
        env.push((WARMUP_ENV.to_string(), cell.params.warmup.to_string()));
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
