//! Metrics, defined once: what each metric is ([`catalog`]), model FLOPs per token, the
//! peak-FLOPs table, MFU ([`flops`]), and the statistics of step times and repeats
//! ([`stats`]).

pub mod catalog;
pub mod flops;
pub mod stats;
