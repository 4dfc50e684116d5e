//! The figures of an ingested run, by the published recipes' formulas (NVIDIA's NeMo and
//! Paxml recipe pages, `crate::metrics::flops`):
//!
//! - step time: the median of the measured steps' times (after `--skip-steps`), bench's
//!   own statistic for every cell (the recipe pages quote one late step's time);
//! - tokens/s = global batch x sequence length / step time; per GPU: over the GPUs;
//! - model TFLOP/s per GPU = tokens/s per GPU x FLOPs per token ([`super::model`]);
//! - MFU = that / the peak dense TFLOP/s of one GPU for the run's dtype;
//! - days to 1T tokens = 1e12 / tokens/s / 86400; GPU-hours per 1T = days x 24 x GPUs.
//!
//! Before any figure, each step is held to what the hardware allows: no step is faster
//! than its model FLOPs at the peak of every GPU (a forged or misread figure, or
//! parameters that do not match the run), so an absurd line is an error at its file:line.

use super::collect::Collector;
use super::error::IngestError;
use super::model::ModelFlops;
use super::parse::{Context, Framework, Own, Step};
use super::read::for_each_line;
use super::settings::{IngestSettings, PeakSource};
use crate::axes::Dtype;
use crate::metrics::flops::{self, Peak};

/// The GPUs `--gpu` names: the name the peak table and hardware key read.
pub(crate) const GPUS: [(&str, &str); 5] = [
    ("h100", "NVIDIA H100 SXM"),
    ("h200", "NVIDIA H200"),
    ("a100", "NVIDIA A100"),
    ("mi300x", "AMD Instinct MI300X"),
    ("mi250x", "AMD Instinct MI250X"),
];

/// The device name of `--gpu NAME`.
pub(crate) fn gpu_name(short: &str) -> Option<&'static str> {
    GPUS.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(short))
        .map(|(_, v)| *v)
}

/// The peak MFU is measured against, or why the one asked for does not exist.
pub(crate) fn peak(source: &PeakSource, dtype: Dtype) -> Result<Option<Peak>, String> {
    match source {
        PeakSource::None => Ok(None),
        PeakSource::Tflops(t) => {
            if !(t.is_finite() && *t > 0.0) {
                return Err(format!("--peak-tflops {t}: a peak above 0"));
            }
            Ok(Some(Peak {
                tflops: *t,
                policy: format!("--peak-tflops {t} ({} dense, as given)", dtype.name()),
            }))
        }
        PeakSource::Gpu(g) => {
            let name = gpu_name(g).ok_or_else(|| {
                format!(
                    "--gpu {g}: one of {} (or give --peak-tflops)",
                    GPUS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                )
            })?;
            flops::peak_tflops(name, dtype).map(Some).ok_or_else(|| {
                format!(
                    "--gpu {g}: the peak table has no {} peak for it; give --peak-tflops",
                    dtype.name()
                )
            })
        }
    }
}

/// A log read: its framework and the reporting rank's steps.
#[derive(Debug, Clone)]
pub(crate) struct Log {
    pub framework: Framework,
    pub steps: Vec<Step>,
    /// The rank whose lines give the steps (`None`: lines without rank prefixes).
    pub rank: Option<u32>,
    pub other_ranks: Vec<u32>,
    /// Step lines that gave no time (torchtitan's first).
    pub untimed: usize,
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        sha2::Digest::update(&mut self.hash, &buf[..n]);
        Ok(n)
    }
}

/// Reads every log file in order as one log.
pub(crate) fn read_logs(s: &IngestSettings) -> Result<Log, IngestError> {
    let mut c = Collector::new(
        s.framework,
        Context {
            global_batch: s.global_batch,
            gpus: s.gpus,
        },
    );
    // The same file named twice (or two copies of one log) would read as one run of twice
    // the steps: refused by path (after links) and by content.
    let mut seen: Vec<(std::path::PathBuf, [u8; 32], String)> = Vec::new();
    for path in &s.logs {
        let name = path.display().to_string();
        // A regular file only: a FIFO would wait forever, a device never end.
        let file = crate::files::open_regular(path).map_err(|source| IngestError::Read {
            path: name.clone(),
            source,
        })?;
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        if let Some((_, _, first)) = seen.iter().find(|(p, ..)| *p == real) {
            return Err(IngestError::Log {
                path: name,
                message: format!(
                    "the same file as {first}, given twice: its steps would count twice"
                ),
            });
        }
        // Hashed before it is parsed (one streaming pass), so a copy is named as a copy
        // rather than as a log whose steps go backwards.
        let read_error = |source| IngestError::Read {
            path: name.clone(),
            source,
        };
        let mut hashing = Hashing {
            inner: file,
            hash: sha2::Sha256::default(),
        };
        std::io::copy(&mut hashing, &mut std::io::sink()).map_err(read_error)?;
        let digest: [u8; 32] = sha2::Digest::finalize(hashing.hash).into();
        if let Some((_, _, first)) = seen.iter().find(|(_, d, _)| *d == digest) {
            return Err(IngestError::Log {
                path: name,
                message: format!(
                    "the same content as {first} (SHA-256): one log given twice would read as one run of twice the steps"
                ),
            });
        }
        let mut file = hashing.inner;
        std::io::Seek::rewind(&mut file).map_err(read_error)?;
        for_each_line(&name, file, |n, text| c.line(&name, n, text))?;
        seen.push((real, digest, name));
    }
    let all = s
        .logs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let framework = c.framework();
    if framework == Framework::Auto {
        return Err(IngestError::Log {
            path: all,
            message: format!(
                "no step line of any framework bench reads ({}): not a training log, or it ends before the first step",
                Framework::ALL.map(|f| f.name()).join(", ")
            ),
        });
    }
    let lines = c.step_lines;
    let (steps, rank, other_ranks, untimed) = c.finish();
    if steps.is_empty() {
        return Err(IngestError::Log {
            path: all,
            message: format!(
                "no {} step line with a step time ({lines} step line(s), none timed): the log ends before a step could be measured",
                framework.name()
            ),
        });
    }
    Ok(Log {
        framework,
        steps,
        rank,
        other_ranks,
        untimed,
    })
}

/// The run's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Figures {
    /// Median of the measured steps' times.
    pub step_time_s: f64,
    pub measured_steps: usize,
    pub tokens_per_step: u64,
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    pub tflops_per_gpu: f64,
    pub mfu: Option<f64>,
    pub days_per_1t_tokens: f64,
    pub gpu_hours_per_1t_tokens: f64,
    /// The framework's own figures, medians over the measured steps (when every measured
    /// step printed them).
    pub own: Own,
}

/// The median of `f` over `steps`, when every step has it.
fn own_median(steps: &[Step], f: impl Fn(&Own) -> Option<f64>) -> Option<f64> {
    let xs: Option<Vec<f64>> = steps.iter().map(|s| f(&s.own)).collect();
    crate::metrics::stats::median(&xs?)
}

/// Checks every step against the hardware and computes the figures of the measured ones.
pub(crate) fn compute(
    s: &IngestSettings,
    log: &Log,
    model: &ModelFlops,
    peak: Option<&Peak>,
) -> Result<Figures, IngestError> {
    let tokens_per_step = s.global_batch * s.seq_len;
    let step_flops = model.flops_per_token * tokens_per_step as f64;
    let (bound_tflops, bound_words) = match peak {
        Some(p) => (p.tflops, p.policy.clone()),
        None => (
            flops::UNKNOWN_DEVICE_TFLOPS,
            format!(
                "{} TFLOP/s per GPU (the bound of a device the peak table does not know)",
                flops::UNKNOWN_DEVICE_TFLOPS
            ),
        ),
    };
    let fastest = step_flops / (bound_tflops * 1e12 * f64::from(s.gpus));
    for st in &log.steps {
        if st.step_time_s < fastest {
            return Err(IngestError::at(
                &st.file,
                st.line,
                "",
                format!(
                    "step {} took {} s: faster than {bound_words} allows for its {step_flops:.4e} model FLOPs on {} GPU(s) ({fastest:.4e} s at least); the line is wrong, or --model, --global-batch, --seq-len or --gpus do not match the run",
                    st.step, st.step_time_s, s.gpus
                ),
            ));
        }
    }
    if s.skip_steps >= log.steps.len() {
        return Err(IngestError::Log {
            path: log.steps[0].file.to_string(),
            message: format!(
                "the log has {} timed step(s) and --skip-steps is {}: no step is left to measure (lower --skip-steps; 0 measures every step)",
                log.steps.len(),
                s.skip_steps
            ),
        });
    }
    let measured = &log.steps[s.skip_steps..];
    let times: Vec<f64> = measured.iter().map(|m| m.step_time_s).collect();
    let step_time_s = crate::metrics::stats::median(&times)
        .ok_or_else(|| IngestError::Args("no step time to take the median of".into()))?;
    let tokens_per_s = flops::tokens_per_s(tokens_per_step, step_time_s);
    let t = flops::throughput(
        tokens_per_s,
        s.gpus,
        Some(model.flops_per_token),
        peak.map(|p| p.tflops),
    );
    // Every figure within its plausibility bound (crate::bounds): parameters
    // that put MFU at 4e-298 or above 1 are wrong, whatever the log says.
    let gpu_hours = t.days_per_1t_tokens * 24.0 * f64::from(s.gpus);
    for (name, v) in [
        ("step_time_s", Some(step_time_s)),
        ("tokens_per_s", Some(t.tokens_per_s)),
        ("tokens_per_s_per_gpu", Some(t.tokens_per_s_per_gpu)),
        ("tflops_per_gpu", t.tflops_per_gpu),
        ("mfu", t.mfu),
        ("time_to_1t_tokens_days", Some(t.days_per_1t_tokens)),
    ] {
        crate::bounds::check_opt(name, v).map_err(|why| {
            IngestError::Args(format!(
                "{why}: --model/--params-billion, --global-batch, --seq-len, --gpus or the peak do not match the run"
            ))
        })?;
    }
    Ok(Figures {
        step_time_s,
        measured_steps: measured.len(),
        tokens_per_step,
        tokens_per_s: t.tokens_per_s,
        tokens_per_s_per_gpu: t.tokens_per_s_per_gpu,
        tflops_per_gpu: t.tflops_per_gpu.unwrap_or(0.0),
        mfu: t.mfu,
        days_per_1t_tokens: t.days_per_1t_tokens,
        gpu_hours_per_1t_tokens: gpu_hours,
        own: Own {
            tokens_per_s_per_gpu: own_median(measured, |o| o.tokens_per_s_per_gpu),
            tflops_per_gpu: own_median(measured, |o| o.tflops_per_gpu),
            mfu: own_median(measured, |o| o.mfu),
        },
    })
}
