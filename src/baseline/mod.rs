//! Baselines: the stored reference measurements a run is judged against.
//!
//! [`store`] owns the files (`baselines/<hardware-key>.yaml`: loading with located errors,
//! atomic saving, merging a run into them), [`compare`] turns a run and its baselines into a
//! verdict per cell and metric, and [`cmd`] is the `bench baseline update` command.

pub mod cmd;
pub mod compare;
pub mod store;

pub use compare::{compare, CellComparison, CellStatus, Comparison, MetricComparison, Verdict};
pub use store::{BaselineError, Baselines, Direction};
