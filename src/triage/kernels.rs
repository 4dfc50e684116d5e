//! The kernels that moved: one traced step before a change and one after, each a Chrome
//! trace (the JSON format of libtorch's and PyTorch's profiler, which the built-in workload
//! and the framework drivers write under `BENCH_PROFILE` (scripts/frameworks/step_trace.py)
//! and a command workload may write itself), summed by kernel
//! and by kind (matmul, attention, norm, optimizer, collectives, copies, ...) and diffed:
//! device time before and after, the kinds and the kernels whose time changed most, and for a
//! data-parallel cell (one trace per rank) the collective time no compute kernel hid.
//!
//! Pure apart from reading the trace files: the command layer runs the traced steps
//! (`crate::commands::triage`) and the reports render the [`KernelDiff`] a finding carries.
//!
//! A trace of one step of a large model holds millions of host events; the reader streams the
//! event array and keeps only device events (`cat` `kernel`, `gpu_memcpy`, `gpu_memset`), so
//! its memory is bounded by the number of distinct kernel names (itself bounded) and the
//! device intervals of the step, not by the file.

use std::fmt;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The largest trace file read: a traced step of a 70B-proxy cell is a few hundred MiB.
pub const MAX_TRACE_BYTES: u64 = 2048 * crate::files::MIB;
/// Distinct kernel names kept per trace; a trace with more is not one step of training.
const MAX_NAMES: usize = 100_000;
/// Device intervals kept per trace (for the exposed-collective measure).
const MAX_INTERVALS: usize = 5_000_000;
/// Characters of a kernel name kept (templated CUDA names run to thousands).
const MAX_NAME_CHARS: usize = 300;
/// The longest device event a traced step may hold, microseconds (one hour): anything longer
/// is not one kernel of one step, and summing such values could overflow.
const MAX_EVENT_US: f64 = 3.6e9;
/// Kernels listed in a diff.
pub const TOP_KERNELS: usize = 8;

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: not a Chrome trace ({message}); a workload under BENCH_PROFILE writes one JSON object with a `traceEvents` array (or the array alone)")]
    Format { path: String, message: String },
    #[error("{path}: the trace holds no device kernel (no event of category `kernel`): was the step traced on a GPU?")]
    NoKernels { path: String },
}

/// The kinds kernels are summed into, first match wins: each names what a change would
/// touch (docs/perf-notes.md, scripts/trace-top.py). Substrings of the kernel name.
const KINDS: &[(&str, &[&str])] = &[
    (
        "collectives",
        &[
            "nccl",
            "AllReduce",
            "ReduceScatter",
            "AllGather",
            "all_reduce",
            "reduce_scatter",
            "all_gather",
            "Broadcast",
        ],
    ),
    (
        "optimizer",
        &["master_adamw", "adam", "Adam", "multi_tensor", "optimizer"],
    ),
    (
        "attention",
        &["flash", "fmha", "attention", "attn", "sdpa", "Attention"],
    ),
    (
        "matmul",
        &[
            "gemm", "Gemm", "GEMM", "nvjet", "cutlass", "xmma", "cublas", "Kernel2", "matmul",
            "wgmma",
        ],
    ),
    (
        "norm",
        &[
            "layer_norm",
            "LayerNorm",
            "rms_norm",
            "RmsNorm",
            "rms_fwd",
            "rms_bwd",
            "ln_fwd",
            "ln_bwd",
        ],
    ),
    (
        "loss",
        &["cross_entropy", "softmax", "nll_loss", "ce_fwd", "ce_bwd"],
    ),
    (
        "copies",
        &[
            "Memcpy", "memcpy", "Memset", "memset", "copy", "Copy", "CatArray",
        ],
    ),
    (
        "elementwise",
        &[
            "elementwise",
            "vectorized",
            "unrolled",
            "gelu",
            "swiglu",
            "silu",
            "Elementwise",
        ],
    ),
    ("reduction", &["reduce_kernel", "Reduce", "reduce"]),
    (
        "embedding",
        &[
            "embedding",
            "index_select",
            "indexSelect",
            "scatter",
            "gather",
        ],
    ),
];

/// The kind of a kernel by its name ("other" when no row of [`KINDS`] matches).
pub fn kind_of(name: &str) -> &'static str {
    KINDS
        .iter()
        .find(|(_, pats)| pats.iter().any(|p| name.contains(p)))
        .map_or("other", |(k, _)| k)
}

/// One traced step (one rank): device time per kernel name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTrace {
    /// Microseconds and calls per kernel name, in first-seen order.
    pub kernels: IndexMap<String, (f64, u64)>,
    /// Collective time (microseconds) during which no other kernel ran: the part of the
    /// collectives the step waited for.
    pub exposed_collective_us: f64,
}

impl StepTrace {
    /// Total device kernel time, microseconds.
    pub fn total_us(&self) -> f64 {
        self.kernels.values().map(|(d, _)| d).sum()
    }

    /// Microseconds per kind.
    pub fn by_kind(&self) -> IndexMap<&'static str, f64> {
        let mut m: IndexMap<&'static str, f64> = IndexMap::new();
        for (name, (d, _)) in &self.kernels {
            *m.entry(kind_of(name)).or_default() += d;
        }
        m
    }

    /// The mean of several ranks' traces (each kernel's time and calls averaged), so a
    /// data-parallel step reads like one rank's.
    pub fn mean(ranks: &[StepTrace]) -> StepTrace {
        let n = ranks.len().max(1) as f64;
        let mut out = StepTrace::default();
        for r in ranks {
            for (name, (d, c)) in &r.kernels {
                let e = out.kernels.entry(name.clone()).or_insert((0.0, 0));
                e.0 += d / n;
                e.1 += c;
            }
            out.exposed_collective_us += r.exposed_collective_us / n;
        }
        for (_, (_, c)) in out.kernels.iter_mut() {
            *c = (*c as f64 / n).round() as u64;
        }
        out
    }
}

/// Kernels a [`KernelSummary`] keeps by name; the rest are summed per kind.
const SUMMARY_KERNELS: usize = 200;

/// One traced step of a cell as the history keeps it (`crate::history`'s `bench_kernels`):
/// the largest kernels by name and the rest summed per kind, averaged over the ranks, so a
/// later run's triage can diff against it without a rebuild or a trace file. A few KiB per
/// cell and run, where the trace is MiBs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelSummary {
    pub ranks: usize,
    /// `(name, microseconds, calls)`, largest first.
    pub kernels: Vec<(String, f64, u64)>,
    pub exposed_collective_us: f64,
}

impl KernelSummary {
    /// The summary of one step traced on `ranks` (one trace each).
    pub fn of(ranks: &[StepTrace]) -> KernelSummary {
        let mean = StepTrace::mean(ranks);
        let mut all: Vec<(String, f64, u64)> = mean
            .kernels
            .iter()
            .map(|(n, (d, c))| (n.clone(), *d, *c))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let rest = all.split_off(all.len().min(SUMMARY_KERNELS));
        // The rest, one entry per kind, named so that `kind_of` gives the kind back.
        let mut buckets: IndexMap<&'static str, (f64, u64)> = IndexMap::new();
        for (n, d, c) in rest {
            let e = buckets.entry(kind_of(&n)).or_default();
            e.0 += d;
            e.1 += c;
        }
        for (kind, (d, c)) in buckets {
            let name = match KINDS.iter().find(|(k, _)| *k == kind) {
                Some((_, pats)) => format!("(other kernels: {})", pats[0]),
                None => "(other kernels)".to_string(),
            };
            all.push((name, d, c));
        }
        KernelSummary {
            ranks: ranks.len(),
            kernels: all,
            exposed_collective_us: mean.exposed_collective_us,
        }
    }

    /// The summary as a step trace a [`KernelDiff`] takes.
    pub fn step(&self) -> StepTrace {
        StepTrace {
            kernels: self
                .kernels
                .iter()
                .map(|(n, d, c)| (n.clone(), (*d, *c)))
                .collect(),
            exposed_collective_us: self.exposed_collective_us,
        }
    }
}

/// A device event as the reader keeps it.
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
}

/// What the streaming reader gathers.
#[derive(Default)]
struct Gathered {
    kernels: IndexMap<String, (f64, u64)>,
    /// (start, end, is a collective), microseconds.
    intervals: Vec<(f64, f64, bool)>,
    overflow: Option<String>,
}

impl Gathered {
    fn add(&mut self, e: Event) {
        let device = matches!(
            e.cat.as_deref(),
            Some("kernel" | "gpu_memcpy" | "gpu_memset" | "Kernel")
        );
        if !device || e.ph.as_deref().is_some_and(|p| p != "X") {
            return;
        }
        let (Some(name), Some(dur)) = (e.name, e.dur) else {
            return;
        };
        if !(dur.is_finite() && dur >= 0.0) {
            return;
        }
        if dur > MAX_EVENT_US {
            self.overflow.get_or_insert(format!(
                "a device event of {dur} us, longer than the hour a kernel of one step may take"
            ));
            return;
        }
        let name: String = if name.chars().count() > MAX_NAME_CHARS {
            name.chars().take(MAX_NAME_CHARS).collect()
        } else {
            name
        };
        let collective = kind_of(&name) == "collectives";
        // Memory copies and sets neither are collectives nor hide one: what hides a
        // collective is a compute kernel running beside it (scripts/trace-overlap.py's
        // measure, which the tests compare with).
        let kernel = e
            .cat
            .as_deref()
            .is_some_and(|c| c.eq_ignore_ascii_case("kernel"));
        if let Some(ts) =
            e.ts.filter(|t| t.is_finite() && (t + dur).is_finite() && (kernel || collective))
        {
            if self.intervals.len() < MAX_INTERVALS {
                self.intervals.push((ts, ts + dur, collective));
            } else {
                self.overflow
                    .get_or_insert(format!("more than {MAX_INTERVALS} device events"));
            }
        }
        if !self.kernels.contains_key(&name) && self.kernels.len() >= MAX_NAMES {
            self.overflow
                .get_or_insert(format!("more than {MAX_NAMES} distinct kernel names"));
            return;
        }
        let entry = self.kernels.entry(name).or_insert((0.0, 0));
        entry.0 += dur;
        entry.1 += 1;
    }
}

/// Streams the `traceEvents` array into a [`Gathered`].
struct EventsSeed<'a>(&'a mut Gathered);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // An event that is not an object (a number, a string) is not a device event; it is
        // skipped rather than refusing a trace some other tool annotated.
        while let Some(v) = seq.next_element::<MaybeEvent>()? {
            if let MaybeEvent::Event(e) = v {
                self.0.add(e);
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MaybeEvent {
    Event(Event),
    Other(IgnoredAny),
}

/// The whole file: an object with `traceEvents` (other keys ignored) or the array alone.
struct TraceSeed<'a>(&'a mut Gathered);

impl<'de> DeserializeSeed<'de> for TraceSeed<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TraceSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object with a traceEvents array, or an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        EventsSeed(self.0).visit_seq(seq)?;
        Ok(true)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "traceEvents" && !found {
                map.next_value_seed(EventsSeed(&mut *self.0))?;
                found = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Reads one rank's trace of one step.
pub fn read_trace(path: &Path) -> Result<StepTrace, TraceError> {
    let shown = path.display().to_string();
    let io = |e: std::io::Error| TraceError::Io {
        path: shown.clone(),
        message: e.to_string(),
    };
    let file = crate::files::open_regular(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_TRACE_BYTES {
        return Err(TraceError::Format {
            path: shown,
            message: format!(
                "{len} bytes, more than the {} MiB a trace of one step may take",
                MAX_TRACE_BYTES / crate::files::MIB
            ),
        });
    }
    let reader = std::io::BufReader::new(std::io::Read::take(file, MAX_TRACE_BYTES + 1));
    parse(reader, &shown)
}

/// [`read_trace`] of text already in memory (tests, fuzzing).
pub fn parse_trace(text: &str, path: &str) -> Result<StepTrace, TraceError> {
    parse(text.as_bytes(), path)
}

fn parse<R: std::io::Read>(reader: R, path: &str) -> Result<StepTrace, TraceError> {
    let mut g = Gathered::default();
    let mut de = serde_json::Deserializer::from_reader(reader);
    let found = TraceSeed(&mut g)
        .deserialize(&mut de)
        .and_then(|f| de.end().map(|()| f))
        .map_err(|e| TraceError::Format {
            path: path.to_string(),
            message: e.to_string(),
        })?;
    if !found {
        return Err(TraceError::Format {
            path: path.to_string(),
            message: "no traceEvents key".into(),
        });
    }
    if let Some(why) = g.overflow {
        return Err(TraceError::Format {
            path: path.to_string(),
            message: format!("{why}: not one step of training"),
        });
    }
    if g.kernels.is_empty() {
        return Err(TraceError::NoKernels {
            path: path.to_string(),
        });
    }
    Ok(StepTrace {
        exposed_collective_us: exposed_collectives(&mut g.intervals),
        kernels: g.kernels,
    })
}

/// Collective time no compute kernel overlapped: the union of the collectives' intervals
/// minus its intersection with the union of every other kernel's. Overlap is what the
/// data-parallel schedules buy (DDP's bucketed all-reduce during backward, FSDP's
/// prefetched all-gathers), so a change that exposes communication shows here even when the
/// collectives themselves take as long as before.
fn exposed_collectives(intervals: &mut [(f64, f64, bool)]) -> f64 {
    let union = |mut v: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out: Vec<(f64, f64)> = Vec::new();
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        out
    };
    let comm = union(
        intervals
            .iter()
            .filter(|i| i.2)
            .map(|i| (i.0, i.1))
            .collect(),
    );
    if comm.is_empty() {
        return 0.0;
    }
    let compute = union(
        intervals
            .iter()
            .filter(|i| !i.2)
            .map(|i| (i.0, i.1))
            .collect(),
    );
    let mut exposed = 0.0;
    let mut j = 0;
    for (s, e) in comm {
        let mut covered = 0.0;
        while j < compute.len() && compute[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < compute.len() && compute[k].0 < e {
            covered += compute[k].1.min(e) - compute[k].0.max(s);
            k += 1;
        }
        exposed += (e - s) - covered;
    }
    exposed.max(0.0)
}

/// One kind's or one kernel's time before and after, milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub name: String,
    /// The kernel's kind (for a kind's own row, the kind again).
    pub kind: String,
    pub before_ms: f64,
    pub after_ms: f64,
    pub before_calls: u64,
    pub after_calls: u64,
}

impl Delta {
    pub fn delta_ms(&self) -> f64 {
        self.after_ms - self.before_ms
    }
}

/// The kernels that moved between two traced steps of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelDiff {
    /// The cell that was traced.
    pub cell: String,
    /// What the two traces are of ("last good 1a2b3c4", "first bad 5d6e7f8").
    pub before: String,
    pub after: String,
    /// Ranks traced (one trace each; figures are per rank, averaged).
    pub ranks: usize,
    /// Device kernel time of the step, milliseconds.
    pub before_ms: f64,
    pub after_ms: f64,
    /// Per kind, largest change first (kinds that did not change left out).
    pub kinds: Vec<Delta>,
    /// The kernels whose time changed most, at most [`TOP_KERNELS`].
    pub kernels: Vec<Delta>,
    /// Collective time no compute hid, milliseconds (data-parallel cells).
    pub exposed_collective_ms: Option<[f64; 2]>,
    /// The traces, relative to the run folder: before's files, then after's.
    pub traces: Vec<String>,
}

/// A kernel or kind whose time changed by less than this (milliseconds) is not listed: a
/// traced step's timestamps are microseconds and one launch's jitter is a few of them.
const MIN_DELTA_MS: f64 = 0.005;

impl KernelDiff {
    /// Diffs `before` and `after` (each one trace per rank).
    pub fn of(
        cell: &str,
        labels: [&str; 2],
        before: &[StepTrace],
        after: &[StepTrace],
        traces: Vec<String>,
    ) -> KernelDiff {
        let (b, a) = (StepTrace::mean(before), StepTrace::mean(after));
        let (bk, ak) = (b.by_kind(), a.by_kind());
        let names: indexmap::IndexSet<&str> = bk.keys().chain(ak.keys()).copied().collect();
        let mut kinds: Vec<Delta> = names
            .into_iter()
            .map(|k| Delta {
                name: k.to_string(),
                kind: k.to_string(),
                before_ms: bk.get(k).copied().unwrap_or(0.0) / 1e3,
                after_ms: ak.get(k).copied().unwrap_or(0.0) / 1e3,
                before_calls: 0,
                after_calls: 0,
            })
            .filter(|d| d.delta_ms().abs() >= MIN_DELTA_MS)
            .collect();
        kinds.sort_by(|x, y| y.delta_ms().abs().total_cmp(&x.delta_ms().abs()));
        let mut names: Vec<&String> = b.kernels.keys().collect();
        names.extend(a.kernels.keys().filter(|k| !b.kernels.contains_key(*k)));
        let mut kernels: Vec<Delta> = names
            .into_iter()
            .map(|n| {
                let (bd, bc) = b.kernels.get(n).copied().unwrap_or((0.0, 0));
                let (ad, ac) = a.kernels.get(n).copied().unwrap_or((0.0, 0));
                Delta {
                    name: n.clone(),
                    kind: kind_of(n).to_string(),
                    before_ms: bd / 1e3,
                    after_ms: ad / 1e3,
                    before_calls: bc,
                    after_calls: ac,
                }
            })
            .filter(|d| d.delta_ms().abs() >= MIN_DELTA_MS)
            .collect();
        kernels.sort_by(|x, y| y.delta_ms().abs().total_cmp(&x.delta_ms().abs()));
        kernels.truncate(TOP_KERNELS);
        let ranks = before.len().max(after.len());
        let collectives = b.exposed_collective_us > 0.0 || a.exposed_collective_us > 0.0;
        KernelDiff {
            cell: cell.to_string(),
            before: labels[0].to_string(),
            after: labels[1].to_string(),
            ranks,
            before_ms: b.total_us() / 1e3,
            after_ms: a.total_us() / 1e3,
            kinds,
            kernels,
            exposed_collective_ms: (ranks > 1 || collectives)
                .then_some([b.exposed_collective_us / 1e3, a.exposed_collective_us / 1e3]),
            traces,
        }
    }

    /// The diff in one line: device time before and after, then the largest kind and
    /// kernel changes ("device time 31.12 -> 32.18 ms; +0.74 ms copies; master_adamw 1.20 ms
    /// -> gone, multi_tensor_apply_kernel new 1.33 ms").
    pub fn summary(&self) -> String {
        let mut parts = vec![format!(
            "device time per step {:.2} -> {:.2} ms ({:+.2} ms)",
            self.before_ms,
            self.after_ms,
            self.after_ms - self.before_ms
        )];
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .take(3)
            .map(|d| format!("{:+.2} ms {}", d.delta_ms(), d.name))
            .collect();
        if !kinds.is_empty() {
            parts.push(kinds.join(", "));
        }
        let kernels: Vec<String> = self.kernels.iter().take(3).map(Delta::render).collect();
        if !kernels.is_empty() {
            parts.push(kernels.join(", "));
        }
        if let Some([b, a]) = self.exposed_collective_ms {
            if (a - b).abs() >= MIN_DELTA_MS {
                parts.push(format!("exposed collectives {b:.2} -> {a:.2} ms"));
            }
        }
        parts.join("; ")
    }
}

impl Delta {
    /// `name before -> after ms`, `name new 1.33 ms` or `name 1.20 ms -> gone`.
    pub fn render(&self) -> String {
        let name = short_name(&self.name);
        if self.before_calls == 0 && self.before_ms == 0.0 {
            format!("{name} new {:.2} ms", self.after_ms)
        } else if self.after_calls == 0 && self.after_ms == 0.0 {
            format!("{name} {:.2} ms -> gone", self.before_ms)
        } else {
            format!("{name} {:.2} -> {:.2} ms", self.before_ms, self.after_ms)
        }
    }
}

/// A kernel's name cut at its template arguments and to 60 characters, for one line.
pub fn short_name(name: &str) -> String {
    // libtorch's kernels read `void at::native::(anonymous namespace)::name<...>(...)`: the
    // return type, the namespaces and the template arguments say nothing a reader needs.
    let cleaned = name.replace("(anonymous namespace)::", "");
    let cleaned = cleaned.trim().trim_start_matches("void ").trim();
    let base = cleaned.split(['<', '(']).next().unwrap_or(cleaned).trim();
    let base = base.rsplit("::").next().unwrap_or(base);
    let base = if base.is_empty() { name } else { base };
    if base.chars().count() > 60 {
        format!("{}...", base.chars().take(57).collect::<String>())
    } else {
        base.to_string()
    }
}

/// The trace files of a traced step written at `path` under `BENCH_PROFILE`: the file
/// itself (rank 0) and `STEM.rank{r}.EXT` beside it for the other ranks
/// (`crate::workload`'s naming), in rank order.
pub fn rank_files(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if path.is_file() {
        out.push(path.to_path_buf());
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    for r in 1..4096u32 {
        let name = match &ext {
            Some(e) => format!("{stem}.rank{r}.{e}"),
            None => format!("{stem}.rank{r}"),
        };
        let p = path.with_file_name(name);
        if !p.is_file() {
            break;
        }
        out.push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(name: &str, ts: f64, dur: f64) -> String {
        format!(
            r#"{{"ph":"X","cat":"kernel","name":"{name}","pid":0,"tid":7,"ts":{ts},"dur":{dur},"args":{{"stream":7}}}}"#
        )
    }

    fn trace(events: &[String]) -> String {
        format!(
            r#"{{"schemaVersion":1,"deviceProperties":[{{"id":0}}],"traceEvents":[{{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":0,"dur":50}},{}],"traceName":"x"}}"#,
            events.join(",")
        )
    }

    #[test]
    fn kinds_follow_the_kernel_names() {
        assert_eq!(kind_of("master_adamw_kernel"), "optimizer");
        assert_eq!(
            kind_of("void at::native::multi_tensor_apply_kernel<...>"),
            "optimizer"
        );
        assert_eq!(
            kind_of("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"),
            "matmul"
        );
        assert_eq!(
            kind_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
            "collectives"
        );
        assert_eq!(
            kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop"),
            "attention"
        );
        assert_eq!(kind_of("Memcpy DtoD (Device -> Device)"), "copies");
        assert_eq!(
            kind_of("void at::native::vectorized_elementwise_kernel<4, ...>"),
            "elementwise"
        );
        assert_eq!(kind_of("my_custom_thing"), "other");
    }

    #[test]
    fn a_trace_is_summed_by_kernel_and_host_events_are_ignored() {
        let t = parse_trace(
            &trace(&[
                kernel("gemm_a", 100.0, 400.0),
                kernel("gemm_a", 600.0, 400.0),
                kernel("master_adamw", 1000.0, 1200.0),
            ]),
            "t.json",
        )
        .unwrap();
        assert_eq!(t.kernels["gemm_a"], (800.0, 2));
        assert_eq!(t.kernels["master_adamw"], (1200.0, 1));
        assert_eq!(t.kernels.len(), 2, "the cpu_op is not a kernel");
        assert_eq!(t.total_us(), 2000.0);
        assert_eq!(t.exposed_collective_us, 0.0);
        // The bare array form reads the same.
        let bare = format!("[{}]", kernel("gemm_a", 0.0, 5.0));
        assert_eq!(parse_trace(&bare, "b.json").unwrap().total_us(), 5.0);
    }

    #[test]
    fn the_diff_names_the_kinds_and_kernels_that_moved() {
        let before = parse_trace(
            &trace(&[
                kernel("gemm_a", 0.0, 30000.0),
                kernel("master_adamw", 30000.0, 1200.0),
            ]),
            "b",
        )
        .unwrap();
        let after = parse_trace(
            &trace(&[
                kernel("gemm_a", 0.0, 30000.0),
                kernel("multi_tensor_apply_kernel", 30000.0, 1330.0),
                kernel("elementwise_kernel direct_copy_kernel_cuda", 31330.0, 740.0),
            ]),
            "a",
        )
        .unwrap();
        let d = KernelDiff::of(
            "c",
            ["last good a", "first bad b"],
            &[before],
            &[after],
            vec![],
        );
        assert!((d.before_ms - 31.2).abs() < 1e-9, "{}", d.before_ms);
        assert!((d.after_ms - 32.07).abs() < 1e-9, "{}", d.after_ms);
        assert_eq!(d.kinds[0].name, "copies");
        assert!((d.kinds[0].delta_ms() - 0.74).abs() < 1e-9);
        assert_eq!(d.kinds[1].name, "optimizer");
        assert!((d.kinds[1].delta_ms() - 0.13).abs() < 1e-9);
        assert_eq!(d.kernels.len(), 3, "gemm_a did not move: {:?}", d.kernels);
        assert_eq!(d.kernels[0].name, "multi_tensor_apply_kernel");
        assert_eq!(d.kernels[1].name, "master_adamw");
        let s = d.summary();
        assert!(
            s.starts_with("device time per step 31.20 -> 32.07 ms (+0.87 ms)"),
            "{s}"
        );
        assert!(s.contains("+0.74 ms copies"), "{s}");
        assert!(s.contains("multi_tensor_apply_kernel new 1.33 ms"), "{s}");
        assert!(s.contains("master_adamw 1.20 ms -> gone"), "{s}");
        assert_eq!(d.exposed_collective_ms, None);
    }

    #[test]
    fn exposed_collectives_are_the_part_no_compute_hid() {
        // An all-reduce of 100 us, 60 of them under a GEMM: 40 exposed.
        let t = parse_trace(
            &trace(&[
                kernel("gemm_a", 0.0, 80.0),
                kernel("ncclDevKernel_AllReduce", 20.0, 100.0),
                kernel("gemm_b", 200.0, 10.0),
            ]),
            "t",
        )
        .unwrap();
        assert!((t.exposed_collective_us - 40.0).abs() < 1e-9, "{t:?}");
        let two = StepTrace::mean(&[t.clone(), t]);
        assert!((two.exposed_collective_us - 40.0).abs() < 1e-9);
        assert_eq!(two.kernels["gemm_a"], (80.0, 1));
    }

    #[test]
    fn a_real_ddp_step_shows_the_exposed_all_reduce_that_trace_overlap_measured() {
        // One traced step of the Llama proxy under DDP on two H200s (rank 0), from
        // docs/results/perf-2026-11-27/h200x2-dist-profile/: scripts/trace-overlap.py
        // measured 21.22 ms of NCCL kernels of which 15.02 ms ran beside other kernels,
        // so 6.20 ms exposed (nccl-each.ddp.txt).
        let gz = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/results/perf-2026-11-27/h200x2-dist-profile/ddp.json.gz"
        );
        let out = std::process::Command::new("gzip")
            .args(["-dc", gz])
            .output()
            .unwrap();
        assert!(out.status.success());
        let t = parse_trace(std::str::from_utf8(&out.stdout).unwrap(), "ddp.json").unwrap();
        let exposed_ms = t.exposed_collective_us / 1e3;
        assert!((exposed_ms - 6.20).abs() < 0.05, "{exposed_ms}");
        let collectives = t.by_kind()["collectives"] / 1e3;
        assert!((collectives - 21.22).abs() < 0.05, "{collectives}");
    }

    #[test]
    fn the_framework_drivers_traces_read_as_their_kernels() {
        // One step of the Llama proxy traced by the HF Trainer's and torchtitan's drivers on
        // an H200 (docs/results/triage-2026-11-27/framework-traces/): kernels 213.58 ms and
        // 161.97 ms, memory copies and sets 0.10 ms and 0.13 ms (summed in Python).
        for (name, kernels_ms, copies_ms) in [
            ("hf", 213.580269, 0.101536),
            ("torchtitan", 161.972707, 0.128793),
        ] {
            let gz = format!(
                "{}/docs/results/triage-2026-11-27/framework-traces/{name}.trace.json.gz",
                env!("CARGO_MANIFEST_DIR")
            );
            let out = std::process::Command::new("gzip")
                .args(["-dc", &gz])
                .output()
                .unwrap();
            assert!(out.status.success(), "{gz}");
            let t = parse_trace(std::str::from_utf8(&out.stdout).unwrap(), name).unwrap();
            let total = t.total_us() / 1e3;
            assert!(
                (total - kernels_ms - copies_ms).abs() < 1e-3,
                "{name}: {total}"
            );
            let kinds = t.by_kind();
            assert!(
                kinds["matmul"] / 1e3 > 0.4 * kernels_ms,
                "{name}: {kinds:?}"
            );
            assert!(
                kinds["attention"] > 0.0 && kinds["optimizer"] > 0.0,
                "{name}: {kinds:?}"
            );
        }
    }

    #[test]
    fn a_summary_keeps_the_largest_kernels_and_the_rest_per_kind() {
        let mut events: Vec<String> = (0..SUMMARY_KERNELS + 10)
            .map(|i| kernel(&format!("gemm_{i:04}"), i as f64 * 1000.0, 500.0 - i as f64))
            .collect();
        events.push(kernel("ncclDevKernel_AllReduce", 0.0, 7.0));
        let t = parse_trace(&trace(&events), "t").unwrap();
        let s = KernelSummary::of(std::slice::from_ref(&t));
        assert_eq!(
            s.kernels.len(),
            SUMMARY_KERNELS + 2,
            "{:?}",
            &s.kernels[SUMMARY_KERNELS..]
        );
        assert_eq!(s.kernels[0].0, "gemm_0000");
        let back = s.step();
        // Nothing is lost in the sums: the total and every kind are the trace's.
        assert!((back.total_us() - t.total_us()).abs() < 1e-6);
        assert_eq!(back.by_kind(), t.by_kind());
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<KernelSummary>(&text).unwrap(), s);
    }

    #[test]
    fn malformed_traces_are_refused_with_the_file_named() {
        for (text, want) in [
            ("", "not a Chrome trace"),
            ("{\"traceEvents\": 3}", "not a Chrome trace"),
            ("{\"other\": []}", "no traceEvents key"),
            ("{\"traceEvents\": [] } trailing", "not a Chrome trace"),
            (
                "{\"traceEvents\": [{\"cat\":\"cpu_op\",\"name\":\"x\",\"dur\":1}]}",
                "no device kernel",
            ),
        ] {
            let e = parse_trace(text, "run/t.json").unwrap_err().to_string();
            assert!(e.starts_with("run/t.json: "), "{e}");
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // Odd events (not objects, negative or infinite durations) are skipped, not fatal.
        let t = parse_trace(
            r#"{"traceEvents":[1,"x",{"cat":"kernel","ph":"X","name":"k","dur":-1},{"cat":"kernel","ph":"X","name":"k","ts":0,"dur":2}]}"#,
            "t",
        )
        .unwrap();
        assert_eq!(t.kernels["k"], (2.0, 1));
    }

    #[test]
    fn rank_files_follow_the_workload_naming() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("good.trace.json");
        std::fs::write(&p, "[]").unwrap();
        std::fs::write(tmp.path().join("good.trace.rank1.json"), "[]").unwrap();
        std::fs::write(tmp.path().join("good.trace.rank3.json"), "[]").unwrap();
        let files = rank_files(&p);
        assert_eq!(
            files.len(),
            2,
            "rank 3 without rank 2 is not read: {files:?}"
        );
        assert!(files[1].ends_with("good.trace.rank1.json"));
        assert!(rank_files(&tmp.path().join("none.json")).is_empty());
        assert_eq!(
            short_name("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>>(int)"),
            "multi_tensor_apply_kernel"
        );
        assert_eq!(
            short_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"),
            "vectorized_elementwise_kernel"
        );
    }
}
