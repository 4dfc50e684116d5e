//! `bench`: declarative LLM-training benchmark matrices as a CI gate.
//!
//! Data flow, one stage per module (see docs/ and DESIGN notes):
//! matrix YAML -> [`matrix`] (parse, validate, expand, filter) -> [`cell::Cell`]s ->
//! [`run`] (schedule, execute workers, collect [`events`]) -> [`results`] ->
//! [`baseline`] (compare) -> [`report`] (human, JSON, JUnit, Markdown, PR comment).
//! The built-in training workload lives in [`workload`]; FLOPs, MFU and statistics in
//! [`metrics`]. Worker text passes through [`sanitize`] before it is kept. [`cli`] parses
//! the command line and resolves it into each stage's settings struct; no other module
//! sees clap's types. [`bisect`] walks a commit range with [`run`] and [`history`] to find
//! the commit that changed a cell's speed. [`ingest`] judges a run launched elsewhere from its
//! log, through [`history`]. Every program bench starts (tools, workers, setups) goes
//! through `proc`: bounded in time and output, in a process group, dying with bench.

pub mod atomic;
pub mod axes;
pub mod baseline;
pub mod bisect;
pub mod bounds;
pub mod cell;
pub mod cli;
pub mod commands;
pub mod dist;
pub mod env;
pub mod error;
pub mod events;
pub mod exit;
pub mod external;
pub mod files;
pub mod format;
pub mod history;
pub mod ids;
pub mod ingest;
pub mod judge;
pub mod matrix;
pub mod metrics;
pub(crate) mod proc;
pub mod publish;
pub mod report;
pub mod results;
pub mod run;
pub mod sanitize;
pub mod shard;
pub mod site;
pub mod slurm;
pub mod telemetry;
pub mod trend;
pub mod triage;
pub mod workload;
