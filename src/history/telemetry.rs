//! GPU telemetry sampled while a run measures: SM clock, power, temperature and the
//! driver's active clock-throttle reasons, from `nvidia-smi --query-gpu` every few seconds
//! on a background thread. The summary goes into `telemetry.json` in the run folder and
//! into the history, where a slower run on a throttled GPU is marked as such instead of
//! being blamed on the code. On a host without `nvidia-smi` (a CPU host) the telemetry is
//! recorded as absent.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `nvidia-smi` fields queried, in this order.
pub(crate) const QUERY: &str = "index,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active";

/// Throttle-reason bits that slow a GPU below what the code would get (NVML's
/// `nvmlClocksThrottleReason*`): SW power cap 0x4, HW slowdown 0x8, SW thermal slowdown 0x20,
/// HW thermal slowdown 0x40, HW power brake 0x80. Idle (0x1), application-clock setting
/// (0x2), sync boost (0x10) and display clock (0x100) are not slowdowns of a busy GPU.
pub(crate) const SLOWDOWN_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Seconds between samples.
pub(crate) const INTERVAL: Duration = Duration::from_secs(2);

/// One reading of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Sample {
    pub gpu: u32,
    pub sm_clock_mhz: Option<f64>,
    pub max_sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<f64>,
    pub throttle_reasons: Option<u64>,
}

/// What the samples of one run say, per GPU and together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub samples: usize,
    pub gpus: Vec<GpuSummary>,
    /// Some GPU reported a slowdown reason in [`SLOWDOWN_MASK`] in at least one sample.
    pub throttled: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub gpu: u32,
    pub min_sm_clock_mhz: Option<f64>,
    pub max_sm_clock_mhz: Option<f64>,
    pub max_power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub max_temperature_c: Option<f64>,
    /// The union of the throttle-reason bits seen.
    pub throttle_reasons: u64,
    /// Samples with a slowdown bit set.
    pub throttled_samples: usize,
}

/// Parses `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` output; fields the
/// driver does not support (`[N/A]`, `[Not Supported]`) are `None`, lines that do not
/// parse are skipped.
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() < 7 {
                return None;
            }
            let num = |s: &str| s.parse::<f64>().ok();
            let reasons = f[6]
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            Some(Sample {
                gpu: f[0].parse().ok()?,
                sm_clock_mhz: num(f[1]),
                max_sm_clock_mhz: num(f[2]),
                power_w: num(f[3]),
                power_limit_w: num(f[4]),
                temperature_c: num(f[5]),
                throttle_reasons: reasons,
            })
        })
        .collect()
}

/// Summarizes samples (several per GPU); `None` when there are none.
pub(crate) fn summarize(samples: &[Sample]) -> Option<Telemetry> {
    if samples.is_empty() {
        return None;
    }
    let mut ids: Vec<u32> = samples.iter().map(|s| s.gpu).collect();
    ids.sort_unstable();
    ids.dedup();
    let fold = |v: &mut Option<f64>, x: Option<f64>, pick: fn(f64, f64) -> f64| {
        if let Some(x) = x {
            *v = Some(v.map_or(x, |a| pick(a, x)));
        }
    };
    let gpus: Vec<GpuSummary> = ids
        .iter()
        .map(|&gpu| {
            let mut g = GpuSummary {
                gpu,
                min_sm_clock_mhz: None,
                max_sm_clock_mhz: None,
                max_power_w: None,
                power_limit_w: None,
                max_temperature_c: None,
                throttle_reasons: 0,
                throttled_samples: 0,
            };
            for s in samples.iter().filter(|s| s.gpu == gpu) {
                fold(&mut g.min_sm_clock_mhz, s.sm_clock_mhz, f64::min);
                fold(&mut g.max_sm_clock_mhz, s.max_sm_clock_mhz, f64::max);
                fold(&mut g.max_power_w, s.power_w, f64::max);
                fold(&mut g.power_limit_w, s.power_limit_w, f64::min);
                fold(&mut g.max_temperature_c, s.temperature_c, f64::max);
                let r = s.throttle_reasons.unwrap_or(0);
                g.throttle_reasons |= r;
                if r & SLOWDOWN_MASK != 0 {
                    g.throttled_samples += 1;
                }
            }
            g
        })
        .collect();
    let throttled = gpus.iter().any(|g| g.throttled_samples > 0);
    Some(Telemetry {
        samples: samples.len(),
        gpus,
        throttled,
    })
}

/// Names of the slowdown reasons in `bits`, for reports.
pub(crate) fn reason_names(bits: u64) -> Vec<&'static str> {
    [
        (0x4, "SW power cap"),
        (0x8, "HW slowdown"),
        (0x20, "SW thermal slowdown"),
        (0x40, "HW thermal slowdown"),
        (0x80, "HW power brake"),
    ]
    .iter()
    .filter(|(b, _)| bits & b != 0)
    .map(|&(_, n)| n)
    .collect()
}

/// A background sampler; [`Sampler::finish`] stops it and summarizes.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling when `nvidia-smi` answers the query; `None` otherwise (CPU host).
    pub(crate) fn start() -> Option<Sampler> {
        let first = query()?;
        let samples = Arc::new(Mutex::new(first));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let tick = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !st2.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                waited += tick;
                if waited >= INTERVAL {
                    waited = Duration::ZERO;
                    if let Some(new) = query() {
                        s2.lock().unwrap_or_else(|p| p.into_inner()).extend(new);
                    }
                }
            }
        });
        Some(Sampler {
            stop,
            samples,
            thread: Some(thread),
        })
    }

    /// Stops the thread and summarizes what it saw.
    pub(crate) fn finish(mut self) -> Option<Telemetry> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        summarize(&samples)
    }
}

fn query() -> Option<Vec<Sample>> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={QUERY}"),
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let samples = parse(&String::from_utf8_lossy(&out.stdout));
    (!samples.is_empty()).then_some(samples)
}

/// The file in a run folder.
pub(crate) const FILE: &str = "telemetry.json";

/// Writes the telemetry of a run into its folder (atomically); `None` is written as
/// `null`, which records that the host had no GPU telemetry.
pub(crate) fn save(run_dir: &Path, t: &Option<Telemetry>) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(t).map_err(std::io::Error::other)?;
    crate::atomic::write(&run_dir.join(FILE), &json)
}

/// Reads a run folder's telemetry: `None` when the file is absent or says `null`.
pub(crate) fn load(run_dir: &Path) -> Result<Option<Telemetry>, String> {
    let path = run_dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("{}:{}:{}: {e}", path.display(), e.line(), e.column())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from an H100 SXM host (driver 570) under load, and a clock-capped one.
    const H100: &str = "0, 1980, 1980, 689.12, 700.00, 61, 0x0000000000000000\n\
                        1, 1755, 1980, 699.80, 700.00, 79, 0x0000000000000004\n";

    #[test]
    fn parses_the_query_and_flags_a_power_capped_gpu() {
        let s = parse(H100);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].throttle_reasons, Some(4));
        assert_eq!(s[0].sm_clock_mhz, Some(1980.0));
        let t = summarize(&s).unwrap();
        assert!(t.throttled);
        assert_eq!(t.gpus[1].throttled_samples, 1);
        assert_eq!(reason_names(t.gpus[1].throttle_reasons), ["SW power cap"]);
        assert_eq!(t.gpus[1].min_sm_clock_mhz, Some(1755.0));
    }

    #[test]
    fn idle_and_unsupported_fields_are_not_throttling() {
        let s = parse("0, [N/A], [N/A], [N/A], [N/A], 35, 0x0000000000000001\ngarbage\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sm_clock_mhz, None);
        let t = summarize(&s).unwrap();
        assert!(!t.throttled);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn saves_and_loads_absent_and_present_telemetry() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), Ok(None));
        save(dir.path(), &None).unwrap();
        assert_eq!(load(dir.path()), Ok(None));
        let t = summarize(&parse(H100));
        save(dir.path(), &t).unwrap();
        assert_eq!(load(dir.path()), Ok(t));
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        assert!(load(dir.path()).unwrap_err().contains("telemetry.json:1:"));
    }
}
