//! The raw readings every backend produces: a [`Sample`] of one GPU and an [`AppSample`] of
//! a compute process on one. The AMD parsers build them as much as the NVIDIA stream in
//! `telemetry.rs` does, so they live apart from that file, which imports the parsers.

use serde::{Deserialize, Serialize};

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Sample {
    pub gpu: u32,
    pub uuid: Option<String>,
    pub sm_clock_mhz: Option<f64>,
    pub max_sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<f64>,
    pub utilization_pct: Option<f64>,
    pub throttle_reasons: Option<u64>,
}

/// A compute process seen on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AppSample {
    pub gpu_uuid: String,
    /// The GPU's index when the tool names it by index (amd-smi) rather than by UUID.
    #[serde(default)]
    pub gpu_index: Option<u32>,
    pub pid: u32,
    pub name: String,
    pub used_mib: Option<f64>,
}
