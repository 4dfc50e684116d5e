//! Metrics, defined once: what each metric is ([`catalog`]), model FLOPs per token, the
//! peak-FLOPs table, MFU ([`flops`]), tokens per joule and kWh per 1T tokens from the GPU
//! telemetry's power ([`energy`]), and the statistics of step times and repeats
//! ([`stats`]).

pub mod catalog;
pub mod energy;
pub mod flops;
pub mod stats;
