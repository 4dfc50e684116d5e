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
//! On ROCm the same figures come from `amd-smi` (ROCm 6.x and 7.x), else from `rocm-smi`
//! ([`amd`]): `amd-smi metric --usage --power --clock --temperature --throttle --json` polled
//! (its watch mode `-w` takes whole seconds and, in ROCm 7, prints its JSON only when the
//! watch ends, so it cannot stream), the power cap from `amd-smi static --limit --json` once,
//! HIP's numbering of the GPUs from `amd-smi list -e --json` once, and the compute processes
//! from `amd-smi process --json` every second. The SM clock of an AMD GPU is its GFX clock
//! (the mean over its XCDs), and its violation statuses are counted under NVIDIA's reason
//! names where they mean the same ([`amd::VIOLATIONS`]). `rocm-smi` reports no reasons and no
//! processes in JSON; its cells carry clocks, power, temperature and utilisation only.
//!
//! The backend is the first that answers: `nvidia-smi`, then `amd-smi`, then `rocm-smi`; on
//! a host with none of them (a CPU host), or under `BENCH_TELEMETRY=0`, there is no stream
//! and no telemetry, which the history treats as "nothing to excuse with". Every call of a
//! tool is bounded ([`TOOL_TIMEOUT`], [`MAX_OUTPUT`]): a tool that hangs or prints garbage
//! costs a warning and its figures, never the run, and nothing is ever filled in for it.
//!
//! The raw readings, [`Sample`] and [`AppSample`], are defined in `sample`, apart from this
//! file, because the AMD parsers ([`amd`]) build them too and this file imports those.

mod amd;
pub(crate) mod host;
mod sample;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

pub(crate) use sample::{AppSample, Sample};

/// The `nvidia-smi` fields queried, in this order.
pub(crate) const QUERY: &str = "index,uuid,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active";

/// The compute-process query, in this order.
pub(crate) const APPS_QUERY: &str = "gpu_uuid,pid,process_name,used_memory";

/// Throttle-reason bits that slow a GPU below what the code would get (NVML's
/// `nvmlClocksEventReason*`): SW power cap 0x4, HW slowdown 0x8, SW thermal slowdown 0x20,
/// HW thermal slowdown 0x40, HW power brake 0x80. Idle (0x1), application-clock setting
/// (0x2), sync boost (0x10) and display clock (0x100) are not slowdowns of a busy GPU. The
/// AMD violation bits ([`amd::SLOWDOWN_MASK`]) share NVIDIA's bits where the meaning is the
/// same and sit above bit 32 otherwise, so one mask serves both.
pub(crate) const SLOWDOWN_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80 | amd::SLOWDOWN_MASK;

/// Milliseconds between GPU samples: a gpt2-125m repeat measures for about a second, and
/// a cell needs several samples inside its measured steps.
pub(crate) const INTERVAL_MS: u64 = 100;

/// Between compute-process polls (each is its own `nvidia-smi` or `amd-smi` call).
pub(crate) const APPS_INTERVAL: Duration = Duration::from_millis(1000);

/// The shortest time between the starts of two `amd-smi`/`rocm-smi` metric polls. Each poll
/// is a Python process that takes from tens of milliseconds to a second or more on a host of
/// eight GPUs, so the real rate is usually set by the tool; this bound keeps a fast tool
/// from taking a CPU core away from the cells.
pub(crate) const AMD_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The longest a single call of a telemetry tool may take before it is killed. amd-smi's
/// first call on a large host takes a few seconds; anything near this is a hung tool.
pub(crate) const TOOL_TIMEOUT: Duration = crate::proc::TOOL_TIMEOUT;

/// The most output read from one call of a telemetry tool: an amd-smi answer for eight
/// MI300X GPUs is about 300 KB; more than this is not an answer.
pub(crate) const MAX_OUTPUT: u64 = crate::proc::MAX_OUTPUT;

/// Failed polls in a row after which a tool is given up for the rest of the run, so that a
/// broken tool costs one warning and not a stream of hung processes.
const MAX_FAILURES: u32 = 3;

/// The named slowdown reasons, in report order.
pub(crate) const REASONS: [(u64, &str); 5] = [
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake"),
];

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
    /// The GPUs (nvidia-smi or amd-smi indices) the cell ran on.
    pub gpus: Vec<u32>,
    /// Mean SM clock over the samples (on AMD GPUs the GFX clock, averaged over the XCDs).
    pub sm_clock_mhz: Option<f64>,
    pub max_sm_clock_mhz: Option<f64>,
    /// Mean board power per GPU over the samples (the energy metrics' power, see
    /// `metrics::energy`).
    pub power_w: Option<f64>,
    /// The same mean over each repeat's own measured steps, in repeat order: `None` for a
    /// repeat inside whose steps no power sample fell. Each repeat's tokens/J divides by its
    /// own power; absent in results written before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeat_power_w: Vec<Option<f64>>,
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
    /// The host over the same steps: CPU, run queue, foreign processes, memory pressure
    /// ([`host`]); on a CPU host this is all a cell's telemetry holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<host::HostFigures>,
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
    /// The telemetry of a cell on a host without GPU telemetry: the host's figures alone.
    pub(crate) fn host_only(host: host::HostFigures) -> CellTelemetry {
        CellTelemetry {
            samples: 0,
            gpus: Vec::new(),
            sm_clock_mhz: None,
            max_sm_clock_mhz: None,
            power_w: None,
            repeat_power_w: Vec::new(),
            power_limit_w: None,
            temperature_c: None,
            utilization_pct: None,
            reasons: IndexMap::new(),
            foreign: Vec::new(),
            unverified: Vec::new(),
            host: Some(host),
        }
    }

    /// The fraction of samples that reported `reason` (0 when never).
    pub(crate) fn reason_fraction(&self, reason: &str) -> f64 {
        self.reasons.get(reason).copied().unwrap_or(0.0)
    }
}

/// Every throttle-reason bit a driver defines: NVML's `nvmlClocksEventReason*` (GPU idle
/// 0x1, application clocks 0x2, SW power cap 0x4, HW slowdown 0x8, sync boost 0x10, SW
/// thermal 0x20, HW thermal 0x40, HW power brake 0x80, display clock 0x100) and the AMD
/// violation bits bench maps ([`amd::VIOLATIONS`]). A reading with any other bit set is no
/// driver's.
pub(crate) const KNOWN_REASON_BITS: u64 = 0x1ff | amd::SLOWDOWN_MASK;

/// The physical bounds of one GPU reading, per field: what no GPU bench runs on can report,
/// so a reading past them comes from a broken or forged tool. The SM (or GFX) clock of
/// every data-centre GPU is under 3 GHz (H100 1980 MHz, MI300X 2100 MHz): 4000 MHz
/// leaves room. Board power is under 1.5 kW (H100 SXM 700 W, MI300X 750 W, B200 1000 W):
/// 3000 W. A die reports -40 to 150 C (the parts throttle near 90 C and shut down below
/// 125 C). Utilisation is a percentage.
pub(crate) mod bounds {
    pub(crate) const SM_CLOCK_MHZ: (f64, f64) = (0.0, 4000.0);
    pub(crate) const POWER_W: (f64, f64) = (0.0, 3000.0);
    pub(crate) const TEMPERATURE_C: (f64, f64) = (-40.0, 150.0);
    pub(crate) const UTILIZATION_PCT: (f64, f64) = (0.0, 100.0);
}

/// Why `s` is a reading no GPU can give, or `None` when every field is inside its bound
/// ([`bounds`], [`KNOWN_REASON_BITS`]). A clock or power limit of zero is not a reading
/// either.
pub(crate) fn implausible(s: &Sample) -> Option<String> {
    let check = |what: &str, unit: &str, v: Option<f64>, (lo, hi): (f64, f64), open_low: bool| {
        let v = v?;
        let below = if open_low { v <= lo } else { v < lo };
        (below || v > hi || !v.is_finite())
            .then(|| format!("{what} {v:e} {unit} (bounds {lo}..{hi})"))
    };
    check(
        "SM clock",
        "MHz",
        s.sm_clock_mhz,
        bounds::SM_CLOCK_MHZ,
        true,
    )
    .or_else(|| {
        check(
            "max SM clock",
            "MHz",
            s.max_sm_clock_mhz,
            bounds::SM_CLOCK_MHZ,
            true,
        )
    })
    .or_else(|| check("power", "W", s.power_w, bounds::POWER_W, false))
    .or_else(|| check("power limit", "W", s.power_limit_w, bounds::POWER_W, true))
    .or_else(|| {
        check(
            "temperature",
            "C",
            s.temperature_c,
            bounds::TEMPERATURE_C,
            false,
        )
    })
    .or_else(|| {
        check(
            "utilisation",
            "%",
            s.utilization_pct,
            bounds::UTILIZATION_PCT,
            false,
        )
    })
    .or_else(|| {
        s.throttle_reasons
            .filter(|r| r & !KNOWN_REASON_BITS != 0)
            .map(|r| format!("throttle reasons {r:#x}, with bits no driver defines"))
    })
}

/// Keeps the plausible readings of `samples`; the first implausible one is reported once
/// per process on stderr. A reading is dropped whole: a tool that reports one field no GPU
/// can give is not believed on its others, and a dropped reading excuses nothing.
pub(crate) fn plausible(tool: &str, samples: Vec<Sample>) -> Vec<Sample> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    samples
        .into_iter()
        .filter(|s| match implausible(s) {
            None => true,
            Some(why) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "warning: GPU telemetry: `{tool}` reported a reading no GPU can give (GPU {}: {why}); such readings are left out and excuse nothing",
                        s.gpu
                    );
                }
                false
            }
        })
        .collect()
}

/// Parses `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` output; fields the
/// driver does not support (`[N/A]`, `[Not Supported]`) are `None`, lines that do not
/// parse are skipped, and readings outside the physical [`bounds`] are dropped.
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    plausible("nvidia-smi", text.lines().filter_map(parse_line).collect())
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
                gpu_index: None,
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

/// How a compute process the tool reports relates to this bench: [`owner_of`] its pid, and
/// a foreign pid is believed only when the process `/proc` shows under it is the one the
/// tool named. A tool in a container reports host pids, which can collide with local ones
/// (nvidia-smi's pid 1 `init` is not this host's pid 1), and pids 1 and 2 (init, the
/// kernel's thread parent) never compute on a GPU: such a process is unverified, a note,
/// never a cause.
pub(crate) fn classify(app: &AppSample, me: u32) -> Owner {
    match owner_of(app.pid, me) {
        Owner::Foreign if app.pid <= 2 || !same_process(app.pid, &app.name) => Owner::Unverified,
        o => o,
    }
}

/// Whether the process `/proc` shows as `pid` is the one a tool named `name` (a path or a
/// command name): the basename of its executable, of its first argument, or its command
/// name (which the kernel cuts at 15 bytes) must match the name's basename.
fn same_process(pid: u32, name: &str) -> bool {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).trim().to_string();
    let want = base(name.trim());
    if want.is_empty() || want.starts_with('[') {
        return false;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| base(&p.to_string_lossy()));
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|b| {
            b.split(|c| *c == 0)
                .next()
                .map(|a| base(&String::from_utf8_lossy(a)))
        });
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_string());
    exe.is_some_and(|e| e == want)
        || argv0.is_some_and(|a| a == want)
        || comm.is_some_and(|c| !c.is_empty() && want.starts_with(&c) && c.len() <= want.len())
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

/// Which tool the stream reads, and what it needs to turn a cell's device ids into the
/// tool's GPU indices.
enum Backend {
    /// Device ids are nvidia-smi indices or GPU UUIDs.
    Nvidia,
    /// `amd-smi`: device ids in HIP's numbering, resolved by [`amd::gpu_of`] with the
    /// `ROCR_VISIBLE_DEVICES` bench runs under and `amd-smi list -e`.
    AmdSmi {
        rocr: Option<String>,
        list: Vec<amd::Enumerated>,
    },
    /// `rocm-smi`: as amd-smi, without `list -e`.
    RocmSmi { rocr: Option<String> },
}

impl Backend {
    fn reasons(&self) -> &'static [(u64, &'static str)] {
        match self {
            Backend::Nvidia => &REASONS,
            Backend::AmdSmi { .. } | Backend::RocmSmi { .. } => &amd::REASONS,
        }
    }
}

/// How a poll of the AMD tools asks for its metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
enum AmdQuery {
    /// `amd-smi metric` with `--throttle` (ROCm 6.3 on; 7.x calls it `--violation` and keeps
    /// `--throttle` as a hidden alias).
    AmdSmiThrottle,
    /// `amd-smi metric` without it (before ROCm 6.3, which refuses the option).
    AmdSmi,
    RocmSmi,
}

impl AmdQuery {
    fn program(self) -> &'static str {
        match self {
            AmdQuery::AmdSmiThrottle | AmdQuery::AmdSmi => "amd-smi",
            AmdQuery::RocmSmi => "rocm-smi",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            AmdQuery::AmdSmiThrottle => &[
                "metric",
                "--usage",
                "--power",
                "--clock",
                "--temperature",
                "--throttle",
                "--json",
            ],
            AmdQuery::AmdSmi => &[
                "metric",
                "--usage",
                "--power",
                "--clock",
                "--temperature",
                "--json",
            ],
            AmdQuery::RocmSmi => &[
                "--showuse",
                "--showpower",
                "--showmaxpower",
                "--showclocks",
                "--showtemp",
                "--json",
            ],
        }
    }

    fn parse(self, text: &str, limits: &std::collections::HashMap<u32, f64>) -> Vec<Sample> {
        let samples = match self {
            AmdQuery::AmdSmiThrottle | AmdQuery::AmdSmi => amd::parse_metric(text, limits),
            AmdQuery::RocmSmi => amd::parse_rocm_smi(text),
        };
        plausible(self.program(), samples)
    }

    fn command_line(self) -> String {
        format!("{} {}", self.program(), self.args().join(" "))
    }
}

pub(crate) use crate::proc::ToolError;

/// Runs a telemetry tool through the bounded runner ([`crate::proc::Tool`]): a time limit,
/// a bound on its output, in a process group of its own that is killed with it (a helper
/// holding the pipe open would otherwise keep the reader waiting). Returns its stdout when
/// it exits 0 within `timeout`. `stop`, when set, ends the wait early, so a run never
/// waits for a tool at its end.
pub(crate) fn run_tool(
    program: &str,
    args: &[&str],
    timeout: Duration,
    stop: Option<&AtomicBool>,
) -> Result<String, ToolError> {
    crate::proc::Tool::new(program)
        .args(args)
        .timeout(timeout)
        .max_output(MAX_OUTPUT)
        .stdout(stop)
}

/// Says once, on stderr, that a telemetry tool is not usable and what that costs.
fn warn(what: &str, why: &str) {
    eprintln!("warning: GPU telemetry: `{what}` {why}; the cells measured meanwhile carry no telemetry from it");
}

/// The run's telemetry stream: on NVIDIA one `nvidia-smi -lms` child read by a thread, on
/// AMD a thread polling `amd-smi`/`rocm-smi`; and a thread polling the compute processes.
/// [`Stream::cell`] summarizes a cell's windows; [`Stream::finish`] stops them and
/// summarizes the run.
pub(crate) struct Stream {
    child: Mutex<Option<crate::proc::Watched>>,
    stop: Arc<AtomicBool>,
    data: Arc<Mutex<Collected>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    backend: Backend,
}

impl Stream {
    /// Starts the stream on the first tool that answers its query once: `nvidia-smi`, then
    /// `amd-smi`, then `rocm-smi`; `None` when none does (a CPU host) or under
    /// `BENCH_TELEMETRY=0`.
    pub(crate) fn start() -> Option<Stream> {
        if std::env::var("BENCH_TELEMETRY").is_ok_and(|v| v == "0") {
            return None;
        }
        if let Some(first) = query_once() {
            return Self::start_nvidia(first);
        }
        Self::start_amd()
    }

    fn start_nvidia(first: Vec<Sample>) -> Option<Stream> {
        let now = Instant::now();
        let data = Arc::new(Mutex::new(Collected {
            samples: first.into_iter().map(|s| (now, s)).collect(),
            apps: Vec::new(),
        }));
        // Through the runner's spawn: its own process group, killed with bench.
        let mut child = crate::proc::spawn(
            crate::proc::command("nvidia-smi")
                .args([
                    &format!("--query-gpu={QUERY}"),
                    "--format=csv,noheader,nounits",
                    "-lms",
                    &INTERVAL_MS.to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )
        .ok()?;
        let stdout = child.child.stdout.take()?;
        let pgid = child.pgid();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let d = data.clone();
        threads.push(std::thread::spawn(move || {
            if let Err(why) = read_stream(stdout, &d) {
                warn("nvidia-smi -lms", &why);
                // The leader is reaped only by `finish`, so the group is still this one.
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            }
        }));
        threads.push(spawn_apps_poller(data.clone(), stop.clone(), query_apps));
        Some(Stream {
            child: Mutex::new(Some(child)),
            stop,
            data,
            threads: Mutex::new(threads),
            backend: Backend::Nvidia,
        })
    }

    /// Starts polling `amd-smi` (with `--throttle` when this version has it), else
    /// `rocm-smi`, whichever answers first with at least one GPU.
    fn start_amd() -> Option<Stream> {
        let rocr = std::env::var("ROCR_VISIBLE_DEVICES").ok();
        let mut found = None;
        for query in [
            AmdQuery::AmdSmiThrottle,
            AmdQuery::AmdSmi,
            AmdQuery::RocmSmi,
        ] {
            match run_tool(query.program(), query.args(), TOOL_TIMEOUT, None) {
                Ok(text) => {
                    let samples = query.parse(&text, &Default::default());
                    if !samples.is_empty() {
                        found = Some((query, samples));
                        break;
                    }
                    // An amd-smi that refuses `--throttle` prints usage and exits non-zero;
                    // one that answers with nothing readable is not worth a second try.
                    if query != AmdQuery::AmdSmiThrottle {
                        warn(&query.command_line(), "printed nothing readable");
                    }
                }
                Err(ToolError::Missing { .. }) => {}
                Err(e) => {
                    if query != AmdQuery::AmdSmiThrottle {
                        warn(&query.command_line(), &e.why());
                    }
                }
            }
        }
        let (query, first) = found?;
        let amd_smi = query != AmdQuery::RocmSmi;
        // The power cap and HIP's numbering are read once: amd-smi's metric command reports
        // neither, and neither changes while bench runs unless someone sets a new cap.
        let limits = if amd_smi {
            run_tool(
                "amd-smi",
                &["static", "--limit", "--json"],
                TOOL_TIMEOUT,
                None,
            )
            .map(|t| amd::parse_limits(&t))
            .unwrap_or_default()
        } else {
            Default::default()
        };
        let backend = if amd_smi {
            let list = run_tool("amd-smi", &["list", "-e", "--json"], TOOL_TIMEOUT, None)
                .map(|t| amd::parse_list(&t))
                .unwrap_or_default();
            Backend::AmdSmi { rocr, list }
        } else {
            Backend::RocmSmi { rocr }
        };
        let now = Instant::now();
        let first = if amd_smi {
            first
                .into_iter()
                .map(|mut s| {
                    s.power_limit_w = limits.get(&s.gpu).copied();
                    s
                })
                .collect()
        } else {
            first
        };
        let data = Arc::new(Mutex::new(Collected {
            samples: first.into_iter().map(|s| (now, s)).collect(),
            apps: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let (d, st) = (data.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut failures = 0;
            while !st.load(Ordering::Relaxed) {
                let began = Instant::now();
                let result = run_tool(query.program(), query.args(), TOOL_TIMEOUT, Some(&st));
                if st.load(Ordering::Relaxed) {
                    break;
                }
                // A sample is stamped when its answer arrives, as nvidia-smi's lines are: the
                // tool reads the GPUs at the end of its run, after its start-up.
                let samples = match result {
                    Ok(text) => query.parse(&text, &limits),
                    Err(ToolError::Missing { .. }) => vec![],
                    Err(e) => {
                        let why = e.why();
                        failures += 1;
                        if failures >= MAX_FAILURES {
                            warn(&query.command_line(), &format!("{why} {MAX_FAILURES} times in a row, so it is no longer polled"));
                            break;
                        }
                        continue;
                    }
                };
                if samples.is_empty() {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        warn(&query.command_line(), &format!("printed nothing readable {MAX_FAILURES} times in a row, so it is no longer polled"));
                        break;
                    }
                } else {
                    failures = 0;
                    let at = Instant::now();
                    lock(&d).samples.extend(samples.into_iter().map(|s| (at, s)));
                }
                sleep_until(began + AMD_POLL_INTERVAL, &st);
            }
        }));
        if amd_smi {
            threads.push(spawn_apps_poller(
                data.clone(),
                stop.clone(),
                query_amd_apps,
            ));
        }
        Some(Stream {
            child: Mutex::new(None),
            stop,
            data,
            threads: Mutex::new(threads),
            backend,
        })
    }

    /// The GPU index in the tool's numbering of a cell's device id (see [`Backend`]).
    fn gpu_of(&self, device: &str, uuid_of: &IndexMap<u32, String>) -> Option<u32> {
        match &self.backend {
            Backend::Nvidia => device.parse::<u32>().ok().or_else(|| {
                uuid_of
                    .iter()
                    .find(|(_, u)| u.as_str() == device)
                    .map(|(g, _)| *g)
            }),
            Backend::AmdSmi { rocr, list } => amd::gpu_of(device, rocr.as_deref(), list),
            Backend::RocmSmi { rocr } => amd::gpu_of(device, rocr.as_deref(), &[]),
        }
    }

    /// The telemetry of a cell whose repeats measured in `repeats` (each repeat's window of
    /// measured steps, `None` for one that reported no measured step) on `devices` (device
    /// ids as the runner hands them out: nvidia-smi indices or GPU UUIDs on NVIDIA, HIP
    /// device ids on ROCm). `None` when no sample fell inside the windows.
    pub(crate) fn cell(
        &self,
        repeats: &[Option<(Instant, Instant)>],
        devices: &[String],
    ) -> Option<CellTelemetry> {
        let windows: Vec<(Instant, Instant)> = repeats.iter().flatten().copied().collect();
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
            .filter_map(|d| self.gpu_of(d, &uuid_of))
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
                a.app
                    .gpu_index
                    .or_else(|| {
                        uuid_of
                            .iter()
                            .find(|(_, u)| u.as_str() == a.app.gpu_uuid)
                            .map(|(g, _)| *g)
                    })
                    .map(|g| (a, g))
            })
            .filter(|(_, g)| gpus.contains(g))
            .collect();
        let mut cell = summarize_cell(&samples, &gpus, &apps, self.backend.reasons())?;
        cell.repeat_power_w = repeat_power(&data.samples, &gpus, repeats);
        Some(cell)
    }

    /// Stops the stream and summarizes every sample of the run.
    pub(crate) fn finish(&self) -> Option<Telemetry> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = lock(&self.child).take() {
            let _ = c.kill();
        }
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        let data = lock(&self.data);
        let all: Vec<Sample> = data.samples.iter().map(|(_, s)| s.clone()).collect();
        summarize(&all)
    }
}

/// The longest line read from `nvidia-smi -lms` (one GPU's reading is about 150 bytes); a
/// longer line is read in pieces of this size and dropped.
pub(crate) const MAX_LINE: usize = 4096;

/// The most lines a second the `-lms` stream may print: one per GPU per reading, for 64
/// GPUs, four times over. A stream past it is not nvidia-smi's and is cut off.
pub(crate) const MAX_LINES_PER_S: u64 = 64 * (1000 / INTERVAL_MS) * 4;

/// The most samples a run keeps from the stream (about 1.5 GB at most: 29 hours of eight
/// GPUs); the stream is cut off there.
pub(crate) const MAX_SAMPLES: usize = 1 << 23;

/// Reads the `-lms` stream into `data` until it ends: `Err` with why it was cut off when
/// it printed faster than [`MAX_LINES_PER_S`] or more than [`MAX_SAMPLES`] readings.
/// Holds at most [`MAX_LINE`] bytes of a line, whatever the stream prints.
fn read_stream(stdout: impl Read, data: &Mutex<Collected>) -> Result<(), String> {
    let mut reader = BufReader::with_capacity(64 << 10, stdout);
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut window = Instant::now();
    let mut in_window = 0u64;
    let mut skipping = false;
    loop {
        line.clear();
        match read_line_bounded(&mut reader, &mut line, MAX_LINE) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
        if window.elapsed() >= Duration::from_secs(1) {
            window = Instant::now();
            in_window = 0;
        }
        in_window += 1;
        if in_window > MAX_LINES_PER_S {
            return Err(format!(
                "printed more than {MAX_LINES_PER_S} lines in a second (not nvidia-smi's stream), so it is cut off"
            ));
        }
        // A piece of a line longer than MAX_LINE (or the tail of one) is dropped whole.
        let complete = line.last() == Some(&b'\n');
        if skipping || !complete {
            skipping = !complete;
            continue;
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        if let Some(s) = parse_line(text.trim_end()) {
            let mut d = lock(data);
            if d.samples.len() >= MAX_SAMPLES {
                return Err(format!(
                    "gave {MAX_SAMPLES} readings, the most a run keeps, so it is cut off"
                ));
            }
            d.samples.push((Instant::now(), s));
        }
    }
}

/// Reads one line (through its `\n`) into `line`, or its first `max` bytes when it is
/// longer (the next call reads on from there). The bytes read (0 at the end of the stream).
fn read_line_bounded(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(consumed);
        }
        let room = max - line.len();
        let (n, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) if i < room => (i + 1, true),
            _ => (buf.len().min(room), buf.len() >= room),
        };
        line.extend_from_slice(&buf[..n]);
        reader.consume(n);
        consumed += n;
        if done {
            return Ok(consumed);
        }
    }
}

/// Sleeps until `until`, waking every 50 ms to see whether the stream was stopped.
fn sleep_until(until: Instant, stop: &AtomicBool) {
    let tick = Duration::from_millis(50);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        std::thread::sleep(tick.min(until - now));
    }
}

/// A thread that polls the compute processes with `query` every [`APPS_INTERVAL`] and
/// classifies each as bench's own or not when it is seen (a process may exit before the
/// cell is summarized).
fn spawn_apps_poller(
    data: Arc<Mutex<Collected>>,
    stop: Arc<AtomicBool>,
    query: fn(&AtomicBool) -> Option<Vec<AppSample>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let me = std::process::id();
        while !stop.load(Ordering::Relaxed) {
            let began = Instant::now();
            if let Some(apps) = query(&stop) {
                let at = Instant::now();
                let seen: Vec<SeenApp> = apps
                    .into_iter()
                    .map(|app| SeenApp {
                        owner: classify(&app, me),
                        app,
                        at,
                    })
                    .collect();
                lock(&data).apps.extend(seen);
            }
            sleep_until(began + APPS_INTERVAL, &stop);
        }
    })
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut c) = lock(&self.child).take() {
            let _ = c.kill();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each repeat's mean power per GPU: the mean of the power readings of `gpus` stamped
/// inside that repeat's window (the same samples the cell's mean is taken over); `None` for
/// a repeat without a window or without a power reading in it.
fn repeat_power(
    samples: &[(Instant, Sample)],
    gpus: &[u32],
    repeats: &[Option<(Instant, Instant)>],
) -> Vec<Option<f64>> {
    repeats
        .iter()
        .map(|w| {
            let (a, b) = (*w)?;
            let (sum, n) = samples
                .iter()
                .filter(|(t, s)| *t >= a && *t <= b && gpus.contains(&s.gpu))
                .filter_map(|(_, s)| s.power_w)
                .fold((0.0, 0usize), |(sum, n), w| (sum + w, n + 1));
            (n > 0).then(|| sum / n as f64)
        })
        .collect()
}

/// The cell's figures from its samples and the processes seen (pure, for tests).
fn summarize_cell(
    samples: &[&Sample],
    gpus: &[u32],
    apps: &[(&SeenApp, u32)],
    reason_names: &[(u64, &str)],
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
        for &(bit, name) in reason_names {
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
        repeat_power_w: Vec::new(),
        power_limit_w: max(|s| s.power_limit_w),
        temperature_c: max(|s| s.temperature_c),
        utilization_pct: mean(|s| s.utilization_pct),
        reasons,
        foreign,
        unverified,
        host: None,
    })
}

/// One reading of every GPU from `nvidia-smi`, bounded like every tool call: `None` when it
/// is missing, fails, hangs or answers with nothing readable.
fn query_once() -> Option<Vec<Sample>> {
    let q = format!("--query-gpu={QUERY}");
    let text = match run_tool(
        "nvidia-smi",
        &[&q, "--format=csv,noheader,nounits"],
        TOOL_TIMEOUT,
        None,
    ) {
        Ok(t) => t,
        Err(ToolError::Missing { .. }) => return None,
        Err(e) => {
            // A host with the tool but no usable GPU (driver not loaded) is common on CI
            // runners; only a hang or a flood is worth a word.
            if matches!(
                e,
                ToolError::TimedOut { .. } | ToolError::TooMuchOutput { .. }
            ) {
                warn("nvidia-smi --query-gpu", &e.why());
            }
            return None;
        }
    };
    let samples = parse(&text);
    (!samples.is_empty()).then_some(samples)
}

fn query_apps(stop: &AtomicBool) -> Option<Vec<AppSample>> {
    let q = format!("--query-compute-apps={APPS_QUERY}");
    run_tool(
        "nvidia-smi",
        &[&q, "--format=csv,noheader,nounits"],
        TOOL_TIMEOUT,
        Some(stop),
    )
    .ok()
    .map(|t| parse_apps(&t))
}

/// The compute processes per GPU from `amd-smi process --json`. A failed poll is no answer
/// (not "no process"), so it adds nothing.
fn query_amd_apps(stop: &AtomicBool) -> Option<Vec<AppSample>> {
    run_tool("amd-smi", &["process", "--json"], TOOL_TIMEOUT, Some(stop))
        .ok()
        .map(|t| amd::parse_process(&t))
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
    match crate::files::read_to_string_bounded(&path, crate::files::MAX_RESULTS_BYTES) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("{}:{}:{}: {e}", path.display(), e.line(), e.column())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

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
        let t = summarize_cell(&refs, &[0, 1], &[(&own, 1), (&other, 1)], &REASONS).unwrap();
        assert_eq!(t.samples, 2);
        assert_eq!(t.reason_fraction("SW power cap"), 0.5);
        assert_eq!(t.reason_fraction("HW slowdown"), 0.0);
        assert_eq!(t.sm_clock_mhz, Some((1980.0 + 1755.0) / 2.0));
        assert_eq!(t.foreign.len(), 1);
        assert_eq!(t.foreign[0].name, "python3");
        assert_eq!(t.foreign[0].used_mib, Some(2048.0));
        assert!(summarize_cell(&[], &[0], &[], &REASONS).is_none());
    }

    #[test]
    fn each_repeat_gets_the_mean_power_of_its_own_window() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let reading = |gpu: u32, w: Option<f64>| Sample {
            gpu,
            power_w: w,
            ..parse(H100)[0].clone()
        };
        let samples = vec![
            // Repeat 1 (0..100 ms): GPUs 0 and 1 at 600 and 700 W, GPU 2 is not the cell's.
            (at(10), reading(0, Some(600.0))),
            (at(20), reading(1, Some(700.0))),
            (at(30), reading(2, Some(100.0))),
            // Between the repeats (warm-up of repeat 2): not counted.
            (at(150), reading(0, Some(50.0))),
            // Repeat 2 (200..300 ms): one reading without power, one at 500 W.
            (at(210), reading(0, None)),
            (at(220), reading(1, Some(500.0))),
        ];
        let windows = [
            Some((at(0), at(100))),
            Some((at(200), at(300))),
            // A repeat with no measured step, and one whose window caught no sample.
            None,
            Some((at(400), at(500))),
        ];
        assert_eq!(
            repeat_power(&samples, &[0, 1], &windows),
            vec![Some(650.0), Some(500.0), None, None]
        );
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

    fn app(pid: u32, name: &str) -> AppSample {
        AppSample {
            gpu_uuid: "GPU-0".into(),
            gpu_index: None,
            pid,
            name: name.into(),
            used_mib: None,
        }
    }

    /// Issue 34: a foreign process is believed only when /proc shows the process the tool
    /// named under that pid; init and a pid whose process has another name are unverified.
    #[test]
    fn a_foreign_process_is_believed_only_when_its_pid_is_that_process() {
        let me = std::process::id();
        assert_eq!(classify(&app(1, "init"), me), Owner::Unverified);
        // A process not ours, named rightly (sleep started by a shell, then orphaned, is
        // still our descendant; so ask about our parent, which is not ours).
        let parent = std::os::unix::process::parent_id();
        let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).unwrap();
        if parent > 2 {
            assert_eq!(classify(&app(parent, comm.trim()), me), Owner::Foreign);
            assert_eq!(
                classify(&app(parent, "/opt/other/bin/python3-not-it"), me),
                Owner::Unverified
            );
        }
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(classify(&app(child.id(), "/usr/bin/sleep"), me), Owner::Own);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Issue 34: readings no GPU can give are dropped whole, never believed.
    #[test]
    fn readings_outside_the_physical_bounds_are_dropped() {
        let good = "0, GPU-a, 1755, 1980, 690.5, 700.00, 70, 100, 0x0000000000000004";
        assert_eq!(parse(good).len(), 1);
        for bad in [
            "0, GPU-a, 1e308, 1980, 690.5, 700.00, 70, 100, 0x4",
            "0, GPU-a, 1755, 1980, 690.5, 700.00, 1e12, 100, 0x4",
            "0, GPU-a, 1755, 1980, 690.5, 700.00, 70, 1e9, 0x4",
            "0, GPU-a, 1755, 1980, 690.5, 700.00, 70, 100, 0xffffffffffffffff",
            "0, GPU-a, 1755, 1980, -5, 700.00, 70, 100, 0x4",
            "0, GPU-a, 0, 1980, 690.5, 700.00, 70, 100, 0x4",
            "0, GPU-a, 1755, 1980, 690.5, 0, 70, 100, 0x4",
        ] {
            assert!(parse(bad).is_empty(), "{bad}");
        }
        // Every defined bit at once is a reading a driver can give.
        assert_eq!(
            parse("0, GPU-a, 1755, 1980, 690.5, 700.00, 70, 100, 0x1ff").len(),
            1
        );
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

    #[test]
    fn telemetry_tool_calls_are_bounded_in_time_and_size() {
        // A tool that hangs, and one whose child keeps the pipe open: both are killed at the
        // time limit, whole process group included.
        let t0 = Instant::now();
        let r = run_tool("sh", &["-c", "sleep 30"], Duration::from_millis(300), None);
        assert!(matches!(&r, Err(ToolError::TimedOut { .. })), "{r:?}");
        let r = run_tool(
            "sh",
            &["-c", "(sleep 30; echo late) & echo '[]'; exit 0"],
            Duration::from_millis(300),
            None,
        );
        assert!(matches!(&r, Err(ToolError::OutputOpen { .. })), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // Output past the bound is no answer.
        let r = run_tool(
            "sh",
            &["-c", "head -c 9000000 /dev/zero"],
            TOOL_TIMEOUT,
            None,
        );
        assert!(matches!(&r, Err(ToolError::TooMuchOutput { .. })), "{r:?}");
        // A failing tool, a missing one, a stop request, and one that answers.
        assert!(matches!(
            run_tool("sh", &["-c", "echo x; exit 2"], TOOL_TIMEOUT, None),
            Err(ToolError::Failed { .. })
        ));
        assert_eq!(
            run_tool("bench-no-such-tool-here", &[], TOOL_TIMEOUT, None),
            Err(ToolError::Missing {
                tool: "bench-no-such-tool-here".into()
            })
        );
        let stop = AtomicBool::new(true);
        assert!(matches!(
            run_tool("sh", &["-c", "sleep 30"], TOOL_TIMEOUT, Some(&stop)),
            Err(ToolError::Stopped { .. })
        ));
        assert_eq!(
            run_tool("sh", &["-c", "echo ok"], TOOL_TIMEOUT, None),
            Ok("ok\n".to_string())
        );
    }

    #[test]
    fn telemetry_stream_reader_is_bounded_per_line_and_in_rate() {
        let data = Mutex::new(Collected {
            samples: vec![],
            apps: vec![],
        });
        // Two readings, an overlong line (dropped whole, its tail included), one more.
        let good = H100.lines().next().unwrap();
        let long = format!("{}{good}\n", "x".repeat(3 * MAX_LINE));
        let text = format!("{good}\n{good}\n{long}{good}\n");
        assert_eq!(read_stream(text.as_bytes(), &data), Ok(()));
        assert_eq!(lock(&data).samples.len(), 3);
        // A stream faster than any nvidia-smi is cut off within its first second, having
        // kept no more than the lines of that second.
        let flood = format!("{good}\n").repeat(MAX_LINES_PER_S as usize + 10);
        let data = Mutex::new(Collected {
            samples: vec![],
            apps: vec![],
        });
        let r = read_stream(flood.as_bytes(), &data);
        assert!(
            r.as_ref().is_err_and(|w| w.contains("lines in a second")),
            "{r:?}"
        );
        assert!(lock(&data).samples.len() <= MAX_LINES_PER_S as usize);
        // Endless bytes without a newline: read in bounded pieces, and cut off the same way.
        let data = Mutex::new(Collected {
            samples: vec![],
            apps: vec![],
        });
        let r = read_stream(std::io::repeat(b'7'), &data);
        assert!(r.is_err(), "{r:?}");
        assert!(lock(&data).samples.is_empty());
    }

    #[test]
    fn telemetry_amd_cells_count_amd_reason_names() {
        // A cell on an AMD GPU reports the AMD table's names, with the power cap under the
        // name the history treats as "any busy GPU may show it".
        let s = amd::parse_metric(
            "[{\"gpu\": 0, \"clock\": {\"gfx_0\": {\"clk\": {\"value\": 2100, \"unit\": \"MHz\"}}}, \"throttle\": {\"ppt_violation_status\": \"ACTIVE\", \"vr_thermal_violation_status\": \"NOT ACTIVE\"}}]",
            &Default::default(),
        );
        let refs: Vec<&Sample> = s.iter().collect();
        let t = summarize_cell(&refs, &[0], &[], &amd::REASONS).unwrap();
        assert_eq!(t.reason_fraction("SW power cap"), 1.0);
        assert_eq!(t.reasons.get("VR thermal slowdown"), Some(&0.0));
        assert!(!t.reasons.contains_key("HW power brake"));
        assert!(summarize(&s).unwrap().throttled);
    }
}
