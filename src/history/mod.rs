//! Run history: every finished run in a database, and the verdicts, trends and change
//! points that history allows.
//!
//! Stages, one per file:
//! - [`record`]: what one run contributes (from `results.json` and the run's telemetry).
//! - [`store`]: the store over one [`store::Backend`] trait (versioned migrations,
//!   transactional writes, the queries), with two real backends: [`sqlite`] (an embedded
//!   file, the default) and [`postgres`] (a server by URL, for a fleet).
//! - [`detect`]: the verdict on one measurement against its history (pure statistics).
//! - [`twosample`]: same / different / unknown from two sets of repeats (pure).
//! - [`paired`]: same / different / unknown from pairs measured side by side, the last good
//!   commit against this run's, in one job (pure).
//! - [`environment`]: whether a worse cell's telemetry, against its own clean runs,
//!   explains the loss (pure).
//! - [`suspects`]: what changed since a cell's last good run (pure).
//! - [`recorder`]: writes each cell into the store as soon as it finishes.
//! - [`trends`]: the trends and change points the reports draw, from the store.
//! - [`changepoint`]: change points in a trend (E-divisive means, pure).
//! - [`interrupt`]: Ctrl-C and SIGTERM exit 130 while a store operation blocks.
//! - [`gate`]: `bench matrix --history URL [--confirm]`: record, judge, confirm.
//! - [`cmd`]: `bench history import|CELL|study` and `bench baseline accept`.
//! - [`study`]: the calibration analysis behind the default policy (pure).
//! - [`sequence`]: the same study on ordered months of nights, through the gate's own
//!   verdict (pure).
//! - [`cost`]: what a run's verdict cost in GPU-seconds, as the store keeps it.
//! - [`report`]: the Markdown lines a report shows for a run judged against history.

pub mod changepoint;
pub mod cmd;
pub mod cost;
pub mod detect;
pub mod environment;
mod error;
pub mod gate;
pub(crate) mod interrupt;
pub mod paired;
pub mod postgres;
pub mod record;
pub mod recorder;
pub(crate) mod sequence;
pub mod sqlite;
pub mod store;
pub mod study;
pub mod suspects;
pub mod trends;
pub mod twosample;
pub mod verdicts;
pub mod words;

pub use error::HistoryError;
pub use store::{check, open, open_existing, parse_location, History, Location};

/// The default history file of the `bench history` commands (also `$BENCH_HISTORY`).
pub(crate) const DEFAULT_LOCATION: &str = "bench-history.sqlite";
