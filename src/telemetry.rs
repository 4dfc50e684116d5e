//! GPU telemetry while cells measure: SM clock, power and its limit, temperature, GPU
//! utilisation and the driver's active clock-event (throttle) reasons, streamed by one
//! `nvidia-smi --query-gpu ... -lms` process for the whole run, plus the compute processes
//! on each GPU, polled. Every sample is stamped with the instant it arrived, so each cell's
//! figures come from the samples taken **during its own measured steps** on **its own
//! GPUs** ([`Stream::cell`]), not from the run as a whole: a nightly's cells run for
//! seconds to minutes each, and an H100 at full load sits at its power cap, so a per-run
//! "some throttle bit was seen" flag says nothing about any one cell.
//!
//! The history judges a worse cell against its own past with these figures
//! (`history::environment`): what matters is a difference from the cell's clean runs, never
//! a reason that is always there.
//!
//! A foreign process is a compute process on one of the cell's GPUs that is not bench's
//! own: not bench itself and not one of its descendants (bench is the child subreaper of
//! its cells, so even daemonized worker children stay its descendants). A process whose
//! pid this host's `/proc` does not show (another PID namespace) cannot be told apart and
//! is counted as unverified, never as a cause.
//!
//! On a host without `nvidia-smi` (a CPU host) there is no stream and no telemetry. On ROCm
//! hosts `amd-smi`/`rocm-smi` are not read yet: their cells carry no telemetry, which the
//! history treats as "nothing to excuse with".

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// The `nvidia-smi` fields queried, in this order.
pub(crate) const QUERY: &str = "index,uuid,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active";

/// The compute-process query, in this order.
pub(crate) const APPS_QUERY: &str = "gpu_uuid,pid,process_name,used_memory";

/// Throttle-reason bits that slow a GPU below what the code would get (NVML's
/// `nvmlClocksEventReason*`): SW power cap 0x4, HW slowdown 0x8, SW thermal slowdown 0x20,
/// HW thermal slowdown 0x40, HW power brake 0x80. Idle (0x1), application-clock setting
/// (0x2), sync boost (0x10) and display clock (0x100) are not slowdowns of a busy GPU.
pub(crate) const SLOWDOWN_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Milliseconds between GPU samples: a gpt2-125m repeat measures for about a second, and
/// a cell needs several samples inside its measured steps.
pub(crate) const INTERVAL_MS: u64 = 100;

/// Between compute-process polls (each is its own `nvidia-smi` call).
pub(crate) const APPS_INTERVAL: Duration = Duration::from_millis(1000);

/// The named slowdown reasons, in report order.
pub(crate) const REASONS: [(u64, &str); 5] = [
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake"),
];

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
    pub pid: u32,
    pub name: String,
    pub used_mib: Option<f64>,
}

/// What the samples of one run say, per GPU and together (kept in `telemetry.json` and the
/// run's history row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub samples: usize,
    pub gpus: Vec<GpuSummary>,
    /// Some GPU reported a slowdown reason in [`SLOWDOWN_MASK`] in at least one sample.
    /// Kept for old readers; it excuses nothing (see the module docs).
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

/// The telemetry of one cell over its measured steps, on its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellTelemetry {
    /// Samples (one per GPU per reading) inside the measured steps.
    pub samples: usize,
    /// The GPUs (nvidia-smi indices) the cell ran on.
    pub gpus: Vec<u32>,
    /// Mean SM clock over the samples.
    pub sm_clock_mhz: Option<f64>,
    pub max_sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    /// Highest temperature seen.
    pub temperature_c: Option<f64>,
    /// Mean GPU utilisation, percent.
    pub utilization_pct: Option<f64>,
    /// Per slowdown reason (by name), the fraction of samples that reported it.
    pub reasons: IndexMap<String, f64>,
    /// Compute processes on the cell's GPUs that were not bench's own.
    pub foreign: Vec<ForeignProcess>,
    /// Compute processes whose pid this host cannot see (another PID namespace): neither
    /// proven foreign nor own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<ForeignProcess>,
}

/// A compute process on one of a cell's GPUs during its measured steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForeignProcess {
    pub gpu: u32,
    pub pid: u32,
    pub name: String,
    pub used_mib: Option<f64>,
}

impl CellTelemetry {
    /// The fraction of samples that reported `reason` (0 when never).
    pub(crate) fn reason_fraction(&self, reason: &str) -> f64 {
        self.reasons.get(reason).copied().unwrap_or(0.0)
    }
}

/// Parses `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` output; fields the
/// driver does not support (`[N/A]`, `[Not Supported]`) are `None`, lines that do not
/// parse are skipped.
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 9 {
        return None;
    }
    let num = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite());
    let reasons = f[8]
        .strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok());
    Some(Sample {
        gpu: f[0].parse().ok()?,
        uuid: Some(f[1].to_string()).filter(|u| u.starts_with("GPU-")),
        sm_clock_mhz: num(f[2]),
        max_sm_clock_mhz: num(f[3]),
        power_w: num(f[4]),
        power_limit_w: num(f[5]),
        temperature_c: num(f[6]),
        utilization_pct: num(f[7]),
        throttle_reasons: reasons,
    })
}

/// Parses `nvidia-smi --query-compute-apps=APPS_QUERY --format=csv,noheader,nounits`.
pub(crate) fn parse_apps(text: &str) -> Vec<AppSample> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() < 4 || !f[0].starts_with("GPU-") {
                return None;
            }
            Some(AppSample {
                gpu_uuid: f[0].to_string(),
                pid: f[1].parse().ok()?,
                name: f[2].to_string(),
                used_mib: f[3].parse().ok(),
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
#[cfg(test)]
pub(crate) fn reason_names(bits: u64) -> Vec<&'static str> {
    REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|&(_, n)| n)
        .collect()
}

/// How a compute process relates to this bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Own,
    Foreign,
    Unverified,
}

/// Whether `pid` is this process or one of its descendants, by walking the parent chain in
/// `/proc`. A pid `/proc` does not show is [`Owner::Unverified`].
pub(crate) fn owner_of(pid: u32, me: u32) -> Owner {
    let mut p = pid;
    for _ in 0..64 {
        if p == me {
            return Owner::Own;
        }
        if p <= 1 {
            return Owner::Foreign;
        }
        match parent_of(p) {
            Some(pp) => p = pp,
            None => {
                return if p == pid {
                    Owner::Unverified
                } else {
                    // The chain broke while walking (a parent exited): not ours to claim.
                    Owner::Foreign
                };
            }
        }
    }
    Owner::Foreign
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A classified compute process, stamped when seen.
#[derive(Debug, Clone)]
struct SeenApp {
    at: Instant,
    app: AppSample,
    owner: Owner,
}

#[derive(Default)]
struct Collected {
    samples: Vec<(Instant, Sample)>,
    apps: Vec<SeenApp>,
}

/// The run's telemetry stream: one `nvidia-smi -lms` child read by a thread, and a thread
/// polling the compute processes. [`Stream::cell`] summarizes a cell's windows;
/// [`Stream::finish`] stops both and summarizes the run.
pub(crate) struct Stream {
    child: Mutex<Option<Child>>,
    stop: Arc<AtomicBool>,
    data: Arc<Mutex<Collected>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Stream {
    /// Starts the stream when `nvidia-smi` answers the query once; `None` otherwise (a CPU
    /// host, or `BENCH_TELEMETRY=0`).
    pub(crate) fn start() -> Option<Stream> {
        if std::env::var("BENCH_TELEMETRY").is_ok_and(|v| v == "0") {
            return None;
        }
        let first = query_once()?;
        let now = Instant::now();
        let data = Arc::new(Mutex::new(Collected {
            samples: first.into_iter().map(|s| (now, s)).collect(),
            apps: Vec::new(),
        }));
        let mut child = Command::new("nvidia-smi")
            .args([
                &format!("--query-gpu={QUERY}"),
                "--format=csv,noheader,nounits",
                "-lms",
                &INTERVAL_MS.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let stdout = child.stdout.take()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let d = data.clone();
        threads.push(std::thread::spawn(move || {
            // One line per GPU per reading; a line longer than this is not nvidia-smi's.
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                line.clear();
                match (&mut reader).take(4096).read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if let Some(s) = parse_line(line.trim_end()) {
                            lock(&d).samples.push((Instant::now(), s));
                        }
                    }
                }
            }
        }));
        let (d, st) = (data.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let me = std::process::id();
            let tick = Duration::from_millis(50);
            let mut waited = APPS_INTERVAL;
            while !st.load(Ordering::Relaxed) {
                if waited >= APPS_INTERVAL {
                    waited = Duration::ZERO;
                    if let Some(apps) = query_apps() {
                        let at = Instant::now();
                        let seen: Vec<SeenApp> = apps
                            .into_iter()
                            .map(|app| SeenApp {
                                owner: owner_of(app.pid, me),
                                app,
                                at,
                            })
                            .collect();
                        lock(&d).apps.extend(seen);
                    }
                }
                std::thread::sleep(tick);
                waited += tick;
            }
        }));
        Some(Stream {
            child: Mutex::new(Some(child)),
            stop,
            data,
            threads: Mutex::new(threads),
        })
    }

    /// The telemetry of a cell that measured in `windows` on `devices` (device ids as the
    /// runner hands them out: nvidia-smi indices, or GPU UUIDs). `None` when no sample fell
    /// inside the windows.
    pub(crate) fn cell(
        &self,
        windows: &[(Instant, Instant)],
        devices: &[String],
    ) -> Option<CellTelemetry> {
        let data = lock(&self.data);
        let inside = |t: Instant| windows.iter().any(|(a, b)| t >= *a && t <= *b);
        // Process polls are a second apart: one just before or after a window still
        // tells who was on the GPU during it.
        let near = |t: Instant| {
            windows
                .iter()
                .any(|(a, b)| t + APPS_INTERVAL >= *a && t <= *b + APPS_INTERVAL)
        };
        let uuid_of: IndexMap<u32, String> = data
            .samples
            .iter()
            .filter_map(|(_, s)| s.uuid.clone().map(|u| (s.gpu, u)))
            .collect();
        let gpus: Vec<u32> = devices
            .iter()
            .filter_map(|d| {
                d.parse::<u32>().ok().or_else(|| {
                    uuid_of
                        .iter()
                        .find(|(_, u)| u.as_str() == d.as_str())
                        .map(|(g, _)| *g)
                })
            })
            .collect();
        if gpus.is_empty() {
            return None;
        }
        let samples: Vec<&Sample> = data
            .samples
            .iter()
            .filter(|(t, s)| inside(*t) && gpus.contains(&s.gpu))
            .map(|(_, s)| s)
            .collect();
        let apps: Vec<(&SeenApp, u32)> = data
            .apps
            .iter()
            .filter(|a| near(a.at))
            .filter_map(|a| {
                uuid_of
                    .iter()
                    .find(|(_, u)| u.as_str() == a.app.gpu_uuid)
                    .map(|(g, _)| (a, *g))
            })
            .filter(|(_, g)| gpus.contains(g))
            .collect();
        summarize_cell(&samples, &gpus, &apps)
    }

    /// Stops the stream and summarizes every sample of the run.
    pub(crate) fn finish(&self) -> Option<Telemetry> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = lock(&self.child).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        let data = lock(&self.data);
        let all: Vec<Sample> = data.samples.iter().map(|(_, s)| s.clone()).collect();
        summarize(&all)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = lock(&self.child).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cell's figures from its samples and the processes seen (pure, for tests).
fn summarize_cell(
    samples: &[&Sample],
    gpus: &[u32],
    apps: &[(&SeenApp, u32)],
) -> Option<CellTelemetry> {
    if samples.is_empty() {
        return None;
    }
    let mean = |f: fn(&Sample) -> Option<f64>| {
        let v: Vec<f64> = samples.iter().filter_map(|s| f(s)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let max = |f: fn(&Sample) -> Option<f64>| {
        samples
            .iter()
            .filter_map(|s| f(s))
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
    };
    let with_reasons: Vec<u64> = samples.iter().filter_map(|s| s.throttle_reasons).collect();
    let mut reasons = IndexMap::new();
    if !with_reasons.is_empty() {
        for (bit, name) in REASONS {
            let n = with_reasons.iter().filter(|r| *r & bit != 0).count();
            reasons.insert(name.to_string(), n as f64 / with_reasons.len() as f64);
        }
    }
    let mut foreign: Vec<ForeignProcess> = Vec::new();
    let mut unverified: Vec<ForeignProcess> = Vec::new();
    for (a, gpu) in apps {
        let list = match a.owner {
            Owner::Own => continue,
            Owner::Foreign => &mut foreign,
            Owner::Unverified => &mut unverified,
        };
        match list
            .iter_mut()
            .find(|p| p.pid == a.app.pid && p.gpu == *gpu)
        {
            Some(p) => {
                p.used_mib = match (p.used_mib, a.app.used_mib) {
                    (Some(x), Some(y)) => Some(x.max(y)),
                    (x, y) => x.or(y),
                }
            }
            None => list.push(ForeignProcess {
                gpu: *gpu,
                pid: a.app.pid,
                name: a.app.name.clone(),
                used_mib: a.app.used_mib,
            }),
        }
    }
    Some(CellTelemetry {
        samples: samples.len(),
        gpus: gpus.to_vec(),
        sm_clock_mhz: mean(|s| s.sm_clock_mhz),
        max_sm_clock_mhz: max(|s| s.max_sm_clock_mhz),
        power_w: mean(|s| s.power_w),
        power_limit_w: max(|s| s.power_limit_w),
        temperature_c: max(|s| s.temperature_c),
        utilization_pct: mean(|s| s.utilization_pct),
        reasons,
        foreign,
        unverified,
    })
}

fn query_once() -> Option<Vec<Sample>> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={QUERY}"),
            "--format=csv,noheader,nounits",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let samples = parse(&String::from_utf8_lossy(&out.stdout));
    (!samples.is_empty()).then_some(samples)
}

fn query_apps() -> Option<Vec<AppSample>> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-compute-apps={APPS_QUERY}"),
            "--format=csv,noheader,nounits",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| parse_apps(&String::from_utf8_lossy(&out.stdout)))
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

    // The query's shape as an H100 SXM host (driver 580) prints it under load, and a
    // clock-capped one.
    const H100: &str = "0, GPU-aaaa, 1980, 1980, 689.12, 700.00, 61, 100, 0x0000000000000000\n\
                        1, GPU-bbbb, 1755, 1980, 699.80, 700.00, 79, 98, 0x0000000000000004\n";

    #[test]
    fn parses_the_query_and_flags_a_power_capped_gpu() {
        let s = parse(H100);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].throttle_reasons, Some(4));
        assert_eq!(s[0].sm_clock_mhz, Some(1980.0));
        assert_eq!(s[1].uuid.as_deref(), Some("GPU-bbbb"));
        assert_eq!(s[1].utilization_pct, Some(98.0));
        let t = summarize(&s).unwrap();
        assert!(t.throttled);
        assert_eq!(t.gpus[1].throttled_samples, 1);
        assert_eq!(reason_names(t.gpus[1].throttle_reasons), ["SW power cap"]);
        assert_eq!(t.gpus[1].min_sm_clock_mhz, Some(1755.0));
    }

    #[test]
    fn idle_and_unsupported_fields_are_not_throttling() {
        let s =
            parse("0, GPU-x, [N/A], [N/A], [N/A], [N/A], 35, [N/A], 0x0000000000000001\ngarbage\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sm_clock_mhz, None);
        let t = summarize(&s).unwrap();
        assert!(!t.throttled);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn a_cell_summary_counts_reason_fractions_and_sorts_processes() {
        let s = parse(H100);
        let at = Instant::now();
        let own = SeenApp {
            at,
            app: parse_apps("GPU-bbbb, 10, bench, 1000")[0].clone(),
            owner: Owner::Own,
        };
        let other = SeenApp {
            at,
            app: parse_apps("GPU-bbbb, 11, python3, 2048\n")[0].clone(),
            owner: Owner::Foreign,
        };
        let refs: Vec<&Sample> = s.iter().collect();
        let t = summarize_cell(&refs, &[0, 1], &[(&own, 1), (&other, 1)]).unwrap();
        assert_eq!(t.samples, 2);
        assert_eq!(t.reason_fraction("SW power cap"), 0.5);
        assert_eq!(t.reason_fraction("HW slowdown"), 0.0);
        assert_eq!(t.sm_clock_mhz, Some((1980.0 + 1755.0) / 2.0));
        assert_eq!(t.foreign.len(), 1);
        assert_eq!(t.foreign[0].name, "python3");
        assert_eq!(t.foreign[0].used_mib, Some(2048.0));
        assert!(summarize_cell(&[], &[0], &[]).is_none());
    }

    #[test]
    fn this_process_and_its_children_are_own() {
        let me = std::process::id();
        assert_eq!(owner_of(me, me), Owner::Own);
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(owner_of(child.id(), me), Owner::Own);
        let _ = child.kill();
        let _ = child.wait();
        // Init is nobody's child here.
        assert_eq!(owner_of(1, me), Owner::Foreign);
        // A pid no process has.
        assert_eq!(owner_of(u32::MAX - 7, me), Owner::Unverified);
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
