//! The ROCm side of the telemetry: parsers of `amd-smi` (ROCm 6.x and 7.x) and `rocm-smi`
//! JSON, and the mapping of a cell's device ids onto `amd-smi`'s GPU indices.
//!
//! The shapes were taken from the tools' own sources (`amdsmi_cli/amdsmi_commands.py` and
//! `amdsmi_logger.py` of amdsmi for ROCm 6.3.0 and 7.1.0, `python_smi_tools/rocm_smi.py` of
//! rocm_smi_lib for ROCm 6.3); the fixtures under `tests/fixtures/amd/` name theirs. What
//! differs between versions, and is handled here:
//!
//! - ROCm 6.x prints a top-level array of per-GPU objects; 7.x wraps `metric`, `static` and
//!   `list` in `{"gpu_data": [...]}` (`process` stays an array).
//! - A value is a bare number (6.0), an object `{"value": .., "unit": ..}` (6.1 on), a string
//!   with a unit (`"2100 MHz"`, rocm-smi's `"(2100Mhz)"`) or `"N/A"`.
//! - The violation (throttle) status is `"ACTIVE"`/`"NOT ACTIVE"` per GPU in 6.3, and in
//!   7.x either that or, per compute partition, `{"xcp_0": ["ACTIVE", "N/A", ...]}`. Before
//!   6.3 there is no `--throttle` option at all.
//!
//! A value the tool marks unsupported, a unit this module does not know and a number outside
//! what any GPU reports (a 0xFFFF sentinel, a negative power) are all absent, never guessed.

use std::collections::HashMap;

use serde_json::Value;

use super::sample::{AppSample, Sample};

/// The violation statuses `amd-smi metric --throttle` reports, with the bit and the name each
/// is counted under. PPT (package power tracking: the clocks held to the power limit) is what
/// NVIDIA calls the SW power cap, and like it a busy MI300X shows it in most samples; the
/// socket thermal limit is the firmware's thermal slowdown, as NVIDIA's SW thermal slowdown
/// is the driver's; PROCHOT is the hardware "processor hot" signal, NVIDIA's HW thermal
/// slowdown. The voltage-regulator and HBM thermal limits have no NVIDIA counterpart and keep
/// names of their own, on bits above NVIDIA's 32 so that they never collide.
pub(crate) const VIOLATIONS: [(&str, u64); 5] = [
    ("ppt_violation_status", 0x4),
    ("socket_thermal_violation_status", 0x20),
    ("prochot_violation_status", 0x40),
    ("vr_thermal_violation_status", 1 << 32),
    ("hbm_thermal_violation_status", 1 << 33),
];

/// The named slowdown reasons of an AMD GPU, in report order (see [`VIOLATIONS`]).
pub(crate) const REASONS: [(u64, &str); 5] = [
    (0x4, "SW power cap"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (1 << 32, "VR thermal slowdown"),
    (1 << 33, "HBM thermal slowdown"),
];

/// Every bit of [`REASONS`].
pub(crate) const SLOWDOWN_MASK: u64 = 0x4 | 0x20 | 0x40 | (1 << 32) | (1 << 33);

/// What a quantity measures, for its unit and its plausible range.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    ClockMhz,
    PowerW,
    TemperatureC,
    Percent,
    MemoryMib,
}

impl Kind {
    /// The factor that turns a value in `unit` into this kind's unit; `None` for a unit this
    /// kind is not measured in, so that a changed unit is absent rather than misread.
    fn factor(self, unit: &str) -> Option<f64> {
        let u = unit.trim().to_ascii_lowercase();
        match self {
            Kind::ClockMhz => match u.as_str() {
                "" | "mhz" => Some(1.0),
                "ghz" => Some(1000.0),
                "khz" => Some(1e-3),
                "hz" => Some(1e-6),
                _ => None,
            },
            Kind::PowerW => match u.as_str() {
                "" | "w" => Some(1.0),
                "mw" => Some(1e-3),
                "uw" | "\u{b5}w" => Some(1e-6),
                _ => None,
            },
            Kind::TemperatureC => match u.as_str() {
                "" | "c" | "\u{b0}c" => Some(1.0),
                _ => None,
            },
            Kind::Percent => match u.as_str() {
                "" | "%" => Some(1.0),
                _ => None,
            },
            Kind::MemoryMib => match u.as_str() {
                "" | "b" => Some(1.0 / 1048576.0),
                "kb" | "kib" => Some(1.0 / 1024.0),
                "mb" | "mib" => Some(1.0),
                "gb" | "gib" => Some(1024.0),
                _ => None,
            },
        }
    }

    /// Whether `v` is a reading a real GPU can give: the tools print sentinels such as 65535
    /// for "unsupported" in some versions, which must not become a clock or a power.
    fn plausible(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                Kind::ClockMhz => v > 0.0 && v <= 10_000.0,
                Kind::PowerW => (0.0..=5_000.0).contains(&v),
                Kind::TemperatureC => (-40.0..=200.0).contains(&v),
                Kind::Percent => (0.0..=100.0).contains(&v),
                Kind::MemoryMib => (0.0..=16.0 * 1024.0 * 1024.0).contains(&v),
            }
    }
}

/// A number and its unit out of a bare number, `{"value": .., "unit": ..}` or a string such
/// as `"2100 MHz"` or rocm-smi's `"(2100Mhz)"`; `None` for `"N/A"` and anything else.
fn quantity(v: &Value) -> Option<(f64, String)> {
    match v {
        Value::Number(n) => n.as_f64().map(|x| (x, String::new())),
        Value::String(s) => {
            let s = s
                .trim()
                .trim_start_matches('(')
                .trim_end_matches(')')
                .trim();
            let end = s
                .char_indices()
                .find(|(_, c)| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e')))
                .map_or(s.len(), |(i, _)| i);
            // An exponent marker alone ("e") is not a number; `parse` refuses it.
            let x: f64 = s[..end].trim().parse().ok()?;
            Some((x, s[end..].trim().to_string()))
        }
        Value::Object(o) => {
            let (x, inner_unit) = quantity(o.get("value")?)?;
            let unit = match o.get("unit") {
                Some(Value::String(u)) => u.clone(),
                Some(_) => return None,
                None => inner_unit,
            };
            Some((x, unit))
        }
        _ => None,
    }
}

/// The value in `kind`'s unit when it is present, in a known unit and plausible.
fn read(v: Option<&Value>, kind: Kind) -> Option<f64> {
    let (x, unit) = quantity(v?)?;
    let x = x * kind.factor(&unit)?;
    kind.plausible(x).then_some(x)
}

/// The first JSON document in `text`: the tools may print a warning line before it (amd-smi
/// prints its group-membership check to stdout), and a document cut short is no document.
pub(crate) fn first_json(text: &str) -> Option<Value> {
    let start = text.find(['[', '{'])?;
    serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()?
        .ok()
}

/// The per-GPU objects of an amd-smi answer: a top-level array (ROCm 6.x, and `process` in
/// 7.x) or the `gpu_data` array of 7.x.
fn gpu_entries(v: &Value) -> Vec<(u32, &serde_json::Map<String, Value>)> {
    let list = match v {
        Value::Array(a) => a.as_slice(),
        Value::Object(o) => match o.get("gpu_data") {
            Some(Value::Array(a)) => a.as_slice(),
            _ => &[],
        },
        _ => &[],
    };
    list.iter()
        .filter_map(|e| {
            let o = e.as_object()?;
            let gpu = o.get("gpu")?.as_u64().filter(|g| *g < 4096)?;
            Some((gpu as u32, o))
        })
        .collect()
}

/// Whether a violation status says active: `"ACTIVE"`, `"NOT ACTIVE"`, or per partition a map
/// or list of those (active when any partition is). `None` when nothing in it was readable.
fn violation(v: &Value) -> Option<bool> {
    match v {
        Value::String(s) => match s.trim().to_ascii_uppercase().as_str() {
            "ACTIVE" => Some(true),
            "NOT ACTIVE" => Some(false),
            _ => None,
        },
        Value::Bool(b) => Some(*b),
        Value::Array(a) => a.iter().filter_map(violation).reduce(|a, b| a || b),
        Value::Object(o) => o.values().filter_map(violation).reduce(|a, b| a || b),
        _ => None,
    }
}

/// Parses `amd-smi metric --usage --power --clock --temperature [--throttle] --json`: one
/// sample per GPU that reported anything. `limits` are the power caps per GPU from
/// `amd-smi static --limit` (the metric command does not report them).
///
/// The GFX clock is the mean over the GPU's graphics clock domains that report one (an
/// MI300X has one per XCD, `gfx_0` .. `gfx_7`); its maximum is the highest `max_clk`. The
/// temperature is the hotspot (junction), else the edge: MI300X reports no edge.
pub(crate) fn parse_metric(text: &str, limits: &HashMap<u32, f64>) -> Vec<Sample> {
    let Some(v) = first_json(text) else {
        return vec![];
    };
    gpu_entries(&v)
        .into_iter()
        .filter_map(|(gpu, o)| {
            let mut clocks = Vec::new();
            let mut max_clock: Option<f64> = None;
            if let Some(Value::Object(c)) = o.get("clock") {
                for (name, dom) in c {
                    if !name.starts_with("gfx_") {
                        continue;
                    }
                    clocks.extend(read(dom.get("clk"), Kind::ClockMhz));
                    if let Some(m) = read(dom.get("max_clk"), Kind::ClockMhz) {
                        max_clock = Some(max_clock.map_or(m, |a| a.max(m)));
                    }
                }
            }
            let temp = o.get("temperature");
            let throttle = o.get("throttle");
            let mut bits = 0u64;
            let mut known = false;
            for (key, bit) in VIOLATIONS {
                if let Some(active) = throttle.and_then(|t| t.get(key)).and_then(violation) {
                    known = true;
                    if active {
                        bits |= bit;
                    }
                }
            }
            let s = Sample {
                gpu,
                uuid: None,
                sm_clock_mhz: (!clocks.is_empty())
                    .then(|| clocks.iter().sum::<f64>() / clocks.len() as f64),
                max_sm_clock_mhz: max_clock,
                power_w: read(
                    o.get("power").and_then(|p| p.get("socket_power")),
                    Kind::PowerW,
                ),
                power_limit_w: limits.get(&gpu).copied(),
                temperature_c: read(temp.and_then(|t| t.get("hotspot")), Kind::TemperatureC)
                    .or_else(|| read(temp.and_then(|t| t.get("edge")), Kind::TemperatureC)),
                utilization_pct: read(
                    o.get("usage").and_then(|u| u.get("gfx_activity")),
                    Kind::Percent,
                ),
                throttle_reasons: known.then_some(bits),
            };
            has_reading(&s).then_some(s)
        })
        .collect()
}

/// A sample that carries at least one reading; one with none (every field N/A) is not a
/// sample of anything and is not counted.
fn has_reading(s: &Sample) -> bool {
    s.sm_clock_mhz.is_some()
        || s.power_w.is_some()
        || s.temperature_c.is_some()
        || s.utilization_pct.is_some()
        || s.throttle_reasons.is_some()
}

/// Parses `amd-smi static --limit --json`: the power cap in force per GPU (`socket_power`,
/// not `max_power`, which is the highest cap that may be set).
pub(crate) fn parse_limits(text: &str) -> HashMap<u32, f64> {
    let Some(v) = first_json(text) else {
        return HashMap::new();
    };
    gpu_entries(&v)
        .into_iter()
        .filter_map(|(gpu, o)| {
            let w = read(
                o.get("limit").and_then(|l| l.get("socket_power")),
                Kind::PowerW,
            )?;
            (w > 0.0).then_some((gpu, w))
        })
        .collect()
}

/// One GPU as `amd-smi list -e` enumerates it (ROCm 6.4 on): its amd-smi index, the index
/// HIP gives it when nothing restricts the devices, and HIP's `GPU-...` UUID.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Enumerated {
    pub gpu: u32,
    pub hip_id: Option<u32>,
    pub hip_uuid: Option<String>,
}

/// Parses `amd-smi list -e --json`.
pub(crate) fn parse_list(text: &str) -> Vec<Enumerated> {
    let Some(v) = first_json(text) else {
        return vec![];
    };
    gpu_entries(&v)
        .into_iter()
        .map(|(gpu, o)| Enumerated {
            gpu,
            hip_id: o
                .get("hip_id")
                .and_then(Value::as_u64)
                .filter(|h| *h < 4096)
                .map(|h| h as u32),
            hip_uuid: o
                .get("hip_uuid")
                .and_then(Value::as_str)
                .filter(|u| u.starts_with("GPU-"))
                .map(String::from),
        })
        .collect()
}

/// Parses `amd-smi process --json`: every process on every GPU, with its VRAM (the
/// `vram_mem` of `memory_usage`, else the total `mem_usage`). A GPU without processes says
/// `"process_info": "No running processes detected"`, which is no process. ROCm 6.1 printed
/// one `process_info` per GPU object instead of a `process_list`; both are read.
pub(crate) fn parse_process(text: &str) -> Vec<AppSample> {
    let Some(v) = first_json(text) else {
        return vec![];
    };
    let mut out = Vec::new();
    for (gpu, o) in gpu_entries(&v) {
        let infos: Vec<&Value> = match (o.get("process_list"), o.get("process_info")) {
            (Some(Value::Array(list)), _) => {
                list.iter().filter_map(|p| p.get("process_info")).collect()
            }
            (_, Some(info)) => vec![info],
            _ => vec![],
        };
        for info in infos {
            let Some(p) = info.as_object() else { continue };
            let Some(pid) = p
                .get("pid")
                .and_then(Value::as_u64)
                .filter(|p| *p > 0 && *p <= u64::from(u32::MAX))
            else {
                continue;
            };
            let name = p
                .get("name")
                .and_then(Value::as_str)
                .map(|n| n.chars().filter(|c| !c.is_control()).take(128).collect())
                .unwrap_or_else(|| "?".to_string());
            let used_mib = read(
                p.get("memory_usage").and_then(|m| m.get("vram_mem")),
                Kind::MemoryMib,
            )
            .or_else(|| read(p.get("mem_usage"), Kind::MemoryMib));
            out.push(AppSample {
                gpu_uuid: String::new(),
                gpu_index: Some(gpu),
                pid: pid as u32,
                name,
                used_mib,
            });
        }
    }
    out
}

/// Parses `rocm-smi --showuse --showpower --showmaxpower --showclocks --showtemp --json`:
/// `{"card0": {"GPU use (%)": "100", "Current Socket Graphics Package Power (W)": "512.0",
/// "Max Graphics Package Power (W)": "750.0", "sclk clock speed:": "(2100Mhz)",
/// "Temperature (Sensor junction) (C)": "61.0", ...}}`. rocm-smi prints no throttle reasons
/// and no maximum clock in JSON, so those are absent.
pub(crate) fn parse_rocm_smi(text: &str) -> Vec<Sample> {
    let Some(Value::Object(cards)) = first_json(text) else {
        return vec![];
    };
    let mut out: Vec<Sample> = cards
        .iter()
        .filter_map(|(card, fields)| {
            let gpu: u32 = card
                .strip_prefix("card")?
                .parse()
                .ok()
                .filter(|g| *g < 4096)?;
            let f = fields.as_object()?;
            let s = Sample {
                gpu,
                uuid: None,
                sm_clock_mhz: read(f.get("sclk clock speed:"), Kind::ClockMhz),
                max_sm_clock_mhz: None,
                power_w: read(
                    f.get("Current Socket Graphics Package Power (W)")
                        .or_else(|| f.get("Average Graphics Package Power (W)")),
                    Kind::PowerW,
                ),
                power_limit_w: read(f.get("Max Graphics Package Power (W)"), Kind::PowerW)
                    .filter(|w| *w > 0.0),
                temperature_c: read(
                    f.get("Temperature (Sensor junction) (C)"),
                    Kind::TemperatureC,
                )
                .or_else(|| read(f.get("Temperature (Sensor edge) (C)"), Kind::TemperatureC)),
                utilization_pct: read(f.get("GPU use (%)"), Kind::Percent),
                throttle_reasons: None,
            };
            has_reading(&s).then_some(s)
        })
        .collect();
    out.sort_by_key(|s| s.gpu);
    out
}

/// The amd-smi index of the GPU a cell's device id names, as the HIP runtime of its worker
/// resolves it. The runner hands out ids in the numbering of `HIP_VISIBLE_DEVICES` (or, on a
/// host it took for NVIDIA, `CUDA_VISIBLE_DEVICES`, which HIP reads the same way), and HIP
/// numbers the devices that `ROCR_VISIBLE_DEVICES` (inherited from bench) leaves visible: id
/// `h` is the `h`-th entry of that list, an unrestricted device index or a `GPU-...` UUID.
/// The unrestricted index is HIP's `hip_id`, which `amd-smi list -e` maps to amd-smi's own
/// index; without that list (amd-smi before ROCm 6.4, or rocm-smi) the two are taken to be
/// the same, as they are on a host whose GPUs are not partitioned. `None` when the id
/// cannot be resolved: such a cell gets no telemetry rather than another GPU's.
pub(crate) fn gpu_of(device: &str, rocr: Option<&str>, list: &[Enumerated]) -> Option<u32> {
    let by_uuid = |u: &str| {
        list.iter()
            .find(|e| e.hip_uuid.as_deref() == Some(u))
            .map(|e| e.gpu)
    };
    let device = device.trim();
    if device.starts_with("GPU-") {
        return by_uuid(device);
    }
    let h: usize = device.parse().ok()?;
    let physical: u32 = match rocr.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => {
            let entry = r.split(',').map(str::trim).nth(h)?;
            if entry.starts_with("GPU-") {
                return by_uuid(entry);
            }
            entry.parse().ok()?
        }
        None => u32::try_from(h).ok()?,
    };
    if list.iter().any(|e| e.hip_id.is_some()) {
        list.iter()
            .find(|e| e.hip_id == Some(physical))
            .map(|e| e.gpu)
    } else {
        Some(physical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/amd/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn telemetry_reads_amd_smi_6_3_metric_of_a_busy_mi300x() {
        let limits = parse_limits(&fixture("amd-smi-6.3-static-limit.json"));
        assert_eq!(limits.get(&0), Some(&750.0));
        assert_eq!(limits.get(&1), Some(&750.0));
        let s = parse_metric(&fixture("amd-smi-6.3-metric.json"), &limits);
        assert_eq!(s.len(), 2, "{s:?}");
        // GPU 0: eight XCDs at 2100 MHz but one at 2090: the mean.
        assert_eq!(s[0].gpu, 0);
        assert_eq!(s[0].sm_clock_mhz, Some((2100.0 * 7.0 + 2090.0) / 8.0));
        assert_eq!(s[0].max_sm_clock_mhz, Some(2100.0));
        assert_eq!(s[0].power_w, Some(748.0));
        assert_eq!(s[0].power_limit_w, Some(750.0));
        // No edge sensor on MI300X: the hotspot.
        assert_eq!(s[0].temperature_c, Some(71.0));
        assert_eq!(s[0].utilization_pct, Some(100.0));
        // PPT active: the SW power cap, nothing else.
        assert_eq!(s[0].throttle_reasons, Some(0x4));
        // GPU 1 is hot: socket thermal and HBM thermal active.
        assert_eq!(s[1].throttle_reasons, Some(0x20 | (1 << 33)));
        assert_eq!(s[1].sm_clock_mhz, Some(1650.0));
    }

    #[test]
    fn telemetry_reads_amd_smi_7_metric_with_gpu_data_and_partition_statuses() {
        let limits = parse_limits(&fixture("amd-smi-7.1-static-limit.json"));
        assert_eq!(limits.get(&0), Some(&750.0));
        let s = parse_metric(&fixture("amd-smi-7.1-metric.json"), &limits);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].sm_clock_mhz, Some(2100.0));
        assert_eq!(s[0].power_w, Some(702.0));
        assert_eq!(s[0].power_limit_w, Some(750.0));
        // PPT reported per partition (`xcp_0`), active in one XCC: active.
        assert_eq!(s[0].throttle_reasons, Some(0x4));
    }

    #[test]
    fn telemetry_amd_smi_before_6_3_has_no_reasons_rather_than_none_seen() {
        // ROCm 6.1: no --throttle, values with units; a sample without any violation status
        // must not claim "no slowdown".
        let s = parse_metric(&fixture("amd-smi-6.1-metric.json"), &HashMap::new());
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].throttle_reasons, None);
        assert_eq!(s[0].sm_clock_mhz, Some(2100.0));
        assert_eq!(s[0].power_w, Some(520.0));
        assert_eq!(s[0].power_limit_w, None);
    }

    #[test]
    fn telemetry_hostile_amd_smi_output_gives_no_made_up_numbers() {
        // Truncated in the middle of a GPU: nothing, not a half-read GPU.
        let full = fixture("amd-smi-6.3-metric.json");
        let cut = &full[..full.len() / 2];
        assert!(parse_metric(cut, &HashMap::new()).is_empty());
        assert!(parse_metric("", &HashMap::new()).is_empty());
        assert!(parse_metric("Segmentation fault", &HashMap::new()).is_empty());
        assert!(parse_metric("{\"gpu_data\": 7}", &HashMap::new()).is_empty());
        // N/A everywhere, sentinels and absurd numbers: absent, and a GPU with nothing left
        // is no sample.
        let s = parse_metric(&fixture("amd-smi-hostile-metric.json"), &HashMap::new());
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].gpu, 1);
        assert_eq!(s[0].sm_clock_mhz, None, "65535 MHz is a sentinel");
        assert_eq!(s[0].power_w, None, "a negative power");
        assert_eq!(s[0].temperature_c, None, "a unit not known");
        assert_eq!(s[0].utilization_pct, None, "250 %");
        assert_eq!(s[0].throttle_reasons, Some(0));
        assert!(parse_limits("[{\"gpu\": 0, \"limit\": {\"socket_power\": \"N/A\"}}]").is_empty());
    }

    #[test]
    fn telemetry_quantities_read_every_shape_and_refuse_unknown_units() {
        let q = |s: &str| read(Some(&serde_json::from_str(s).unwrap()), Kind::ClockMhz);
        assert_eq!(q("2100"), Some(2100.0));
        assert_eq!(q("\"2100 MHz\""), Some(2100.0));
        assert_eq!(q("\"(2100Mhz)\""), Some(2100.0));
        assert_eq!(q("{\"value\": 2.1, \"unit\": \"GHz\"}"), Some(2100.0));
        assert_eq!(q("{\"value\": \"N/A\", \"unit\": \"MHz\"}"), None);
        assert_eq!(q("\"N/A\""), None);
        assert_eq!(q("\"2100 furlongs\""), None);
        assert_eq!(q("{\"value\": 1e308, \"unit\": \"GHz\"}"), None);
        assert_eq!(q("null"), None);
        let m = |s: &str| read(Some(&serde_json::from_str(s).unwrap()), Kind::MemoryMib);
        assert_eq!(m("{\"value\": 2147483648, \"unit\": \"B\"}"), Some(2048.0));
    }

    #[test]
    fn telemetry_reads_amd_smi_processes_of_6_3_7_1_and_6_1() {
        let p = parse_process(&fixture("amd-smi-6.3-process.json"));
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].gpu_index, Some(0));
        assert_eq!(p[0].pid, 420157);
        assert_eq!(p[0].name, "python3");
        assert_eq!(p[0].used_mib, Some(2048.0));
        assert_eq!(p[1].gpu_index, Some(0));
        let p = parse_process(&fixture("amd-smi-7.1-process.json"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].gpu_index, Some(1));
        assert_eq!(p[0].used_mib, Some(1024.0));
        let p = parse_process(
            "[{\"gpu\": 0, \"process_info\": {\"name\": \"rvs\", \"pid\": 7, \"mem_usage\": 0}}]",
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].used_mib, Some(0.0));
        // No process, a pid that is not one, a truncated answer.
        assert!(parse_process("[{\"gpu\": 0, \"process_list\": [{\"process_info\": \"No running processes detected\"}]}]").is_empty());
        assert!(parse_process(
            "[{\"gpu\": 0, \"process_list\": [{\"process_info\": {\"pid\": -3}}]}]"
        )
        .is_empty());
        assert!(
            parse_process("[{\"gpu\": 0, \"process_list\": [{\"process_info\": {\"pid\": 9")
                .is_empty()
        );
    }

    #[test]
    fn telemetry_reads_rocm_smi_json() {
        let s = parse_rocm_smi(&fixture("rocm-smi-6.3.json"));
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].gpu, 0);
        assert_eq!(s[0].sm_clock_mhz, Some(2100.0));
        assert_eq!(s[0].power_w, Some(745.0));
        assert_eq!(s[0].power_limit_w, Some(750.0));
        assert_eq!(s[0].temperature_c, Some(70.0));
        assert_eq!(s[0].utilization_pct, Some(100.0));
        assert_eq!(s[0].throttle_reasons, None);
        // The second card reports its power as an average, and N/A for its clock.
        assert_eq!(s[1].power_w, Some(300.0));
        assert_eq!(s[1].sm_clock_mhz, None);
        assert!(parse_rocm_smi("{\"card0\": {\"GPU use (%)\": \"N/A\"}}").is_empty());
        assert!(parse_rocm_smi("[1, 2]").is_empty());
    }

    #[test]
    fn telemetry_maps_devices_through_rocr_and_hip_numbering() {
        let list = parse_list(&fixture("amd-smi-7.1-list-e.json"));
        assert_eq!(list.len(), 4, "{list:?}");
        // HIP numbers the GPUs differently from amd-smi on this host (fixture: hip_id 0 is
        // amd-smi GPU 1).
        assert_eq!(gpu_of("0", None, &list), Some(1));
        assert_eq!(gpu_of("1", None, &list), Some(0));
        // ROCR_VISIBLE_DEVICES=3,2: HIP device 0 is the fourth device, 1 the third.
        assert_eq!(gpu_of("0", Some("3,2"), &list), Some(3));
        assert_eq!(gpu_of("1", Some("3, 2"), &list), Some(2));
        // Past the end of the ROCr list: no GPU, not GPU 2.
        assert_eq!(gpu_of("2", Some("3,2"), &list), None);
        // UUIDs, in the device id or in the ROCr list.
        assert_eq!(gpu_of("GPU-5a8f2c1d00000002", None, &list), Some(2));
        assert_eq!(gpu_of("0", Some("GPU-5a8f2c1d00000003"), &list), Some(3));
        assert_eq!(gpu_of("GPU-unknown", None, &list), None);
        assert_eq!(gpu_of("x", None, &list), None);
        // Without `list -e` (older amd-smi, rocm-smi) the HIP index is amd-smi's.
        assert_eq!(gpu_of("2", None, &[]), Some(2));
        assert_eq!(gpu_of("1", Some("4,5"), &[]), Some(5));
        assert_eq!(gpu_of("GPU-5a8f2c1d00000002", None, &[]), None);
    }
}
