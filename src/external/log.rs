//! Reading a framework's log: the [`LogParser`] trait `bench adapt` reads through, and the
//! one [`Reader`] that implements it for every adapter. The reader does what every
//! framework's log needs (torchrun's rank prefixes and colour codes off, the drivers'
//! version line, the step order per rank, peak memory per rank, and at the end the checks
//! that the driver spoke and every step came) and hands each other line to the adapter's
//! [`StepLines`], which reads only what its framework prints. Where a driver times the
//! framework's steps itself, [`Progress::driver_step`] checks the figures of its step line
//! for every such adapter alike.
//!
//! A parser turns lines into steps or refuses them: a line that looks like a step line but
//! does not parse, a step out of order (lines lost, or several ranks' lines mixed without
//! rank prefixes), or a log that ends before its last step is a [`ParseError`] naming the
//! line, never a number that might be wrong.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

/// A step as a framework logged it, in bench's terms.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoggedStep {
    /// 1-based step number as the framework counts it.
    pub step: u64,
    /// Seconds the step took, by the framework's clock.
    pub step_time_s: f64,
    pub loss: f64,
    /// The framework's own throughput figures for this step, when it prints them.
    pub tokens_per_s_per_gpu: Option<f64>,
    pub tflops_per_gpu: Option<f64>,
    pub mfu: Option<f64>,
}

/// What the driver script says about itself on its first line (`bench-framework: {json}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct DriverInfo {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub libraries: BTreeMap<String, String>,
    /// e.g. "NVIDIA H100 80GB HBM3" or "cpu".
    pub device: String,
    pub world_size: u32,
}

/// What a parser knows once the log has ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LogEnd {
    pub info: DriverInfo,
    /// Peak device memory per rank in bytes (index = rank), when the framework logs it.
    pub peak_mem_bytes: Vec<u64>,
    /// The framework's end-of-run tokens/s per GPU, for frameworks that print no
    /// per-step throughput.
    pub run_tokens_per_s_per_gpu: Option<f64>,
    /// How the framework measures its own figures (for the report).
    pub method: String,
}

/// A log line bench cannot read as its framework would mean it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{framework} log line {line_no}: {message}{}", if .line.is_empty() { String::new() } else { format!(": `{}`", .line) })]
pub(crate) struct ParseError {
    pub framework: &'static str,
    /// 1-based line number in the framework's output (0: at the end of the log).
    pub line_no: usize,
    /// The line (shortened), empty at the end of the log.
    pub line: String,
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(
        framework: &'static str,
        line_no: usize,
        line: &str,
        message: impl Into<String>,
    ) -> Self {
        let mut line = line.to_string();
        if line.len() > 240 {
            let mut cut = 240;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        ParseError {
            framework,
            line_no,
            line,
            message: message.into(),
        }
    }
}

/// A framework's log reader.
pub(crate) trait LogParser: Send {
    /// Takes one output line (1-based `line_no`); returns the steps it completes.
    fn line(&mut self, line_no: usize, line: &str) -> Result<Vec<LoggedStep>, ParseError>;
    /// The log has ended (the framework exited with `exited_ok`); returns the steps still
    /// held back and what the parser knows, or why the log is incomplete.
    fn finish(&mut self, exited_ok: bool) -> Result<(Vec<LoggedStep>, LogEnd), ParseError>;
    /// The device the driver's version line named, once it has come.
    fn device(&self) -> Option<&str>;
}

static RANK_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[(?:rank|default)(\d+)\]:").expect("static regex"));
static ANSI: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\x1b\[[0-9;]*m").expect("static regex"));

/// Splits torchrun's `[rank<N>]:` (or `[default<N>]:`) prefix off a line and removes
/// terminal colour codes.
pub(crate) fn split_rank(line: &str) -> (Option<u32>, String) {
    let (rank, rest) = match RANK_PREFIX.captures(line) {
        Some(c) => (
            c[1].parse().ok(),
            &line[c.get(0).map(|m| m.end()).unwrap_or(0)..],
        ),
        None => (None, line),
    };
    (rank, ANSI.replace_all(rest, "").into_owned())
}

/// The prefix of the drivers' version line.
pub(crate) const DRIVER_PREFIX: &str = "bench-framework: ";

/// Parses a driver's version line, `None` when `text` is not one.
pub(crate) fn driver_info(
    framework: &'static str,
    line_no: usize,
    text: &str,
) -> Option<Result<DriverInfo, ParseError>> {
    let json = text.strip_prefix(DRIVER_PREFIX)?;
    Some(serde_json::from_str(json).map_err(|e| {
        ParseError::new(
            framework,
            line_no,
            text,
            format!("malformed driver line ({e})"),
        )
    }))
}

/// Per-rank step order: each rank's steps must come as 1, 2, 3, ... with none missing or
/// repeated. Lines of several ranks mixed without rank prefixes show up as repeats.
#[derive(Debug, Default)]
pub(crate) struct StepOrder {
    last: BTreeMap<Option<u32>, u64>,
}

impl StepOrder {
    pub(crate) fn check(&mut self, rank: Option<u32>, step: u64) -> Result<(), String> {
        let last = self.last.get(&rank).copied().unwrap_or(0);
        if step != last + 1 {
            let who = match rank {
                Some(r) => format!("rank {r}"),
                None => "the log".to_string(),
            };
            return Err(if step <= last {
                format!(
                    "step {step} after step {last} in {who}: lines of several ranks are mixed without rank prefixes, or the log repeats (run ranks under torchrun --role rank --tee 3)"
                )
            } else {
                format!(
                    "step {step} follows step {last} in {who}: lines are missing (truncated log?)"
                )
            });
        }
        self.last.insert(rank, step);
        Ok(())
    }

    /// The last step of the lowest rank seen (the reporting rank).
    pub(crate) fn last_step(&self) -> u64 {
        self.last.values().next().copied().unwrap_or(0)
    }
}

/// Checks at the end of a log: the driver said who it is, and every step was logged.
fn check_complete(
    framework: &'static str,
    info: &Option<DriverInfo>,
    last_step: u64,
    expected_steps: u32,
    exited_ok: bool,
) -> Result<DriverInfo, ParseError> {
    let Some(info) = info.clone() else {
        return Err(ParseError::new(
            framework,
            0,
            "",
            format!("the log has no `{DRIVER_PREFIX}` line: the driver did not start, or the log is truncated at its head"),
        ));
    };
    if exited_ok && last_step != u64::from(expected_steps) {
        return Err(ParseError::new(
            framework,
            0,
            "",
            format!(
                "the log ends after step {last_step} of {expected_steps} although the framework exited 0 (truncated log)"
            ),
        ));
    }
    Ok(info)
}

/// The largest memory figure each rank logged (index: rank), for [`LogEnd::peak_mem_bytes`].
#[derive(Debug, Default)]
pub(crate) struct PeakMemory(BTreeMap<u32, u64>);

impl PeakMemory {
    /// Rank `rank` logged `bytes` in use; a rank's peak is the largest it logged.
    pub(crate) fn record(&mut self, rank: u32, bytes: u64) {
        let peak = self.0.entry(rank).or_default();
        *peak = (*peak).max(bytes);
    }

    /// The peaks in rank order.
    pub(crate) fn bytes(&self) -> Vec<u64> {
        self.0.values().copied().collect()
    }
}

/// What a cell asked for, which its framework's log must show it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Asked {
    /// The steps: the log must end with the last of them.
    pub steps: u32,
    pub global_batch: u32,
    pub seq_len: u32,
    pub gpus: u32,
}

impl Asked {
    pub(crate) fn of(cell: &crate::cell::Cell) -> Asked {
        Asked {
            steps: cell.params.steps,
            global_batch: cell.params.global_batch,
            seq_len: cell.params.seq_len,
            gpus: cell.gpus(),
        }
    }

    /// The tokens of one optimizer step: global batch x sequence length.
    pub(crate) fn tokens_per_step(&self) -> u64 {
        u64::from(self.global_batch) * u64::from(self.seq_len)
    }
}

/// What the [`Reader`] keeps of every framework's log, which the adapter's [`StepLines`]
/// reads and adds to.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub asked: Asked,
    /// The driver's version line, once it has come.
    pub info: Option<DriverInfo>,
    pub order: StepOrder,
    pub memory: PeakMemory,
}

impl Progress {
    /// Step `step` comes next in the rank that printed `line` ([`StepOrder`]).
    pub(crate) fn in_order(&mut self, line: &Line<'_>, step: u64) -> Result<(), ParseError> {
        self.order.check(line.rank, step).map_err(|m| line.bad(m))
    }

    /// Reads the figures of step `step` that a bench driver prints when it times the
    /// framework's steps itself (`[bench-<x>] step: N time: T ... tokens: K memory: B`, the
    /// DeepSpeed and HF drivers): the step comes next in its rank, it trained the tokens the
    /// cell asked for (`who` ran them, in the refusal), and its time is a positive number;
    /// its memory is recorded, where the driver printed a figure (it prints -1 where the
    /// device keeps none, a CPU). Returns the step's time, in seconds.
    pub(crate) fn driver_step(
        &mut self,
        line: &Line<'_>,
        step: u64,
        printed: DriverFigures<'_>,
        who: &str,
    ) -> Result<f64, ParseError> {
        self.in_order(line, step)?;
        let tokens: u64 = line.int(printed.tokens, "token count")?;
        let asked = self.asked.tokens_per_step();
        line.agrees(tokens, asked, || {
            format!("{who} ran {tokens} tokens a step; the cell asks for {asked}")
        })?;
        let time = line.positive(Some(printed.time), "step time is not a positive number")?;
        if let Ok(m) = printed.memory.parse::<u64>() {
            self.memory.record(0, m);
        }
        Ok(time)
    }

    /// The ranks the driver says run (1 before its line), to turn whole-run figures into
    /// figures per GPU.
    pub(crate) fn world_size(&self) -> f64 {
        f64::from(self.info.as_ref().map_or(1, |i| i.world_size.max(1)))
    }
}

/// The figures of a bench driver's step line, as printed ([`Progress::driver_step`]).
pub(crate) struct DriverFigures<'a> {
    /// Seconds between step ends, after a device synchronisation.
    pub time: &'a str,
    /// Tokens the step trained on.
    pub tokens: &'a str,
    /// The step's peak reserved device memory in bytes, or -1 where the device keeps no
    /// figure (a CPU).
    pub memory: &'a str,
}

/// One output line as an adapter's [`StepLines`] gets it: torchrun's rank prefix split off,
/// colour codes removed; never the driver's version line (the [`Reader`] took it).
pub(crate) struct Line<'a> {
    framework: &'static str,
    /// 1-based line number in the framework's output.
    pub no: usize,
    /// The line as printed, for error messages.
    pub raw: &'a str,
    pub rank: Option<u32>,
    pub text: String,
}

impl Line<'_> {
    /// The error that refuses this line with `message`.
    pub(crate) fn bad(&self, message: impl Into<String>) -> ParseError {
        ParseError::new(self.framework, self.no, self.raw, message)
    }

    /// An integer field, or `<what> out of range`.
    pub(crate) fn int<T: std::str::FromStr>(
        &self,
        field: &str,
        what: &str,
    ) -> Result<T, ParseError> {
        field
            .parse()
            .map_err(|_| self.bad(format!("{what} out of range")))
    }

    /// A number field as frameworks print it ([`number`]), or `unreadable <what>`.
    pub(crate) fn number(&self, field: &str, what: &str) -> Result<f64, ParseError> {
        number(field).ok_or_else(|| self.bad(format!("unreadable {what}")))
    }

    /// A duration or rate field that must be a finite number above 0, else `message`.
    pub(crate) fn positive(&self, field: Option<&str>, message: &str) -> Result<f64, ParseError> {
        field
            .and_then(number)
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| self.bad(message))
    }

    /// What the framework says it ran (`got`) is what the cell asked for (`want`), else
    /// `message()`: the config or flags did not take.
    pub(crate) fn agrees<T: PartialEq>(
        &self,
        got: T,
        want: T,
        message: impl FnOnce() -> String,
    ) -> Result<(), ParseError> {
        if got == want {
            Ok(())
        } else {
            Err(self.bad(message()))
        }
    }
}

/// What one framework prints, read by the [`Reader`] that does the rest.
pub(crate) trait StepLines: Send {
    /// The framework's name in error messages (the adapter's name).
    const NAME: &'static str;
    /// How the framework measures its own figures (for the report).
    const METHOD: &'static str;

    /// Reads one line (never the driver's version line); returns the steps it completes.
    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError>;

    /// The last step the log completed, once it has ended (the framework exited with
    /// `exited_ok`): the last one in order, unless a step is still waiting for a line.
    fn complete(&self, log: &Progress, _exited_ok: bool) -> Result<u64, ParseError> {
        Ok(log.order.last_step())
    }

    /// The framework's end-of-run tokens/s per GPU, for frameworks that print no per-step
    /// throughput, and any check the end of this framework's log needs.
    fn end(&self, _log: &Progress, _info: &DriverInfo) -> Result<Option<f64>, ParseError> {
        Ok(None)
    }
}

/// Every adapter's [`LogParser`]: the shared reading of [`Progress`] around the adapter's
/// [`StepLines`].
#[derive(Debug, Default)]
pub(crate) struct Reader<S> {
    pub log: Progress,
    pub steps: S,
}

impl<S: StepLines> Reader<S> {
    /// A reader of the log of a cell that asked for `asked`.
    pub(crate) fn new(asked: Asked, steps: S) -> Self {
        Reader {
            log: Progress {
                asked,
                ..Progress::default()
            },
            steps,
        }
    }
}

/// The reader of `cell`'s log, which must end with the cell's last step.
pub(crate) fn reader<S: StepLines + 'static>(
    cell: &crate::cell::Cell,
    steps: S,
) -> Box<dyn LogParser> {
    Box::new(Reader::new(Asked::of(cell), steps))
}

impl<S: StepLines> LogParser for Reader<S> {
    fn line(&mut self, line_no: usize, raw: &str) -> Result<Vec<LoggedStep>, ParseError> {
        let (rank, text) = split_rank(raw);
        if let Some(info) = driver_info(S::NAME, line_no, &text) {
            self.log.info = Some(info?);
            return Ok(vec![]);
        }
        let line = Line {
            framework: S::NAME,
            no: line_no,
            raw,
            rank,
            text,
        };
        self.steps.line(&mut self.log, &line)
    }

    fn finish(&mut self, exited_ok: bool) -> Result<(Vec<LoggedStep>, LogEnd), ParseError> {
        let complete = self.steps.complete(&self.log, exited_ok)?;
        let info = check_complete(
            S::NAME,
            &self.log.info,
            complete,
            self.log.asked.steps,
            exited_ok,
        )?;
        let run_tokens_per_s_per_gpu = self.steps.end(&self.log, &info)?;
        Ok((
            vec![],
            LogEnd {
                peak_mem_bytes: self.log.memory.bytes(),
                run_tokens_per_s_per_gpu,
                method: S::METHOD.to_string(),
                info,
            },
        ))
    }

    fn device(&self) -> Option<&str> {
        self.log.info.as_ref().map(|i| i.device.as_str())
    }
}

/// The checks every adapter's log tests share: a captured log's figures and the hostile
/// edits of it, declared by each adapter as data.
#[cfg(test)]
pub(crate) mod checks;

/// Why `parser` refuses the whole log `text` (of a framework that exited 0); panics when
/// it reads it.
#[cfg(test)]
pub(crate) fn refusal(mut parser: impl LogParser, text: &str) -> ParseError {
    match read_all(&mut parser, text, true) {
        Ok((steps, _)) => panic!(
            "{} steps read from a log that should be refused",
            steps.len()
        ),
        Err(e) => e,
    }
}

/// Reads a whole log: every line, then the end (the framework exited with `exited_ok`).
#[cfg(test)]
pub(crate) fn read_all(
    parser: &mut dyn LogParser,
    text: &str,
    exited_ok: bool,
) -> Result<(Vec<LoggedStep>, LogEnd), ParseError> {
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate() {
        steps.extend(parser.line(i + 1, line)?);
    }
    let (rest, end) = parser.finish(exited_ok)?;
    steps.extend(rest);
    Ok((steps, end))
}

/// A number as frameworks print it (`353,169`, `2.18940`, `1.249e+03`, `nan`, `42.7%`),
/// or `None` when it is not one, or is ambiguous. A comma is read only as a thousands
/// separator in its one unambiguous form: one to three leading digits, then groups of
/// exactly three (`353,169`, `1,234,567.5`). Anything else with a comma (`8,5`, `1,2345`,
/// `12,34,567`) could be a decimal comma and is refused, never read with the comma
/// dropped (`8,5` as 85). A `%` is not part of a number: `train_step_timing in s: 8.5%`
/// is no step time; a field that is a percentage is read with [`percent`].
pub(crate) fn number(s: &str) -> Option<f64> {
    read_number(s, false)
}

/// A percentage field (an MFU as `42.7%`): [`number`] with one trailing `%` allowed, the
/// value as printed (42.7). `%%` or a `%` elsewhere is not a number.
pub(crate) fn percent(s: &str) -> Option<f64> {
    read_number(s, true)
}

fn read_number(s: &str, percentage: bool) -> Option<f64> {
    let t = s.trim();
    let t = if percentage {
        t.strip_suffix('%').unwrap_or(t)
    } else {
        t
    };
    match t.to_ascii_lowercase().as_str() {
        "nan" | "-nan" => return Some(f64::NAN),
        "inf" | "+inf" | "infinity" => return Some(f64::INFINITY),
        "-inf" | "-infinity" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    if t.contains(',') {
        let (sign, body) = match t.strip_prefix(['-', '+']) {
            Some(rest) => (&t[..1], rest),
            None => ("", t),
        };
        let (int, frac) = match body.split_once('.') {
            Some((i, f)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => (i, Some(f)),
            Some(_) => return None,
            None => (body, None),
        };
        let mut groups = int.split(',');
        let head = groups.next()?;
        if head.is_empty() || head.len() > 3 || !head.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut digits = String::from(sign);
        digits.push_str(head);
        for g in groups {
            if g.len() != 3 || !g.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.push_str(g);
        }
        if let Some(f) = frac {
            digits.push('.');
            digits.push_str(f);
        }
        return digits.parse().ok();
    }
    if t.contains('%') {
        return None;
    }
    t.parse().ok()
}

/// Median of the framework's per-step figure over the measured steps (step number above
/// `warmup`); `None` when a measured step lacks it.
pub(crate) fn measured_median(
    steps: &[LoggedStep],
    warmup: u32,
    figure: impl Fn(&LoggedStep) -> Option<f64>,
) -> Option<f64> {
    let xs: Option<Vec<f64>> = steps
        .iter()
        .filter(|s| s.step > u64::from(warmup))
        .map(figure)
        .collect();
    crate::workload::measure::median(&xs?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_prefixes_and_colours() {
        assert_eq!(
            split_rank("[rank1]:[titan] \x1b[31mstep:  2\x1b[39m"),
            (Some(1), "[titan] step:  2".to_string())
        );
        assert_eq!(split_rank("[default0]:x"), (Some(0), "x".to_string()));
        assert_eq!(split_rank("plain"), (None, "plain".to_string()));
    }

    #[test]
    fn step_order_refuses_repeats_and_gaps() {
        let mut o = StepOrder::default();
        o.check(None, 1).unwrap();
        o.check(None, 2).unwrap();
        assert!(o.check(None, 2).unwrap_err().contains("mixed"));
        assert!(o.check(None, 4).unwrap_err().contains("missing"));
        let mut o = StepOrder::default();
        o.check(Some(0), 1).unwrap();
        o.check(Some(1), 1).unwrap();
        o.check(Some(1), 2).unwrap();
        assert_eq!(o.last_step(), 1);
    }

    proptest::proptest! {
        /// Whatever the text, a number read with a comma is the number the text means with
        /// its thousands separators removed, and a comma in any other place reads as none.
        #[test]
        fn a_comma_is_never_dropped_silently(int in 0u64..10_000_000, frac in proptest::option::of(0u32..1000), cut in 1usize..8, junk in "[0-9,.%]{0,12}") {
            let plain = match frac { Some(f) => format!("{int}.{f}"), None => int.to_string() };
            // The unambiguous grouping reads as the plain number.
            let digits = int.to_string();
            let mut grouped = String::new();
            for (i, ch) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 { grouped.push(','); }
                grouped.push(ch);
            }
            if let Some(f) = frac { grouped = format!("{grouped}.{f}"); }
            proptest::prop_assert_eq!(number(&grouped), plain.parse::<f64>().ok());
            // A comma after a group of another length is refused (`1,000` is a grouping:
            // one comma is odd when the group after it is not three digits, or the one
            // before it more than three).
            if digits.len() > cut && (cut != 3 || digits.len() - cut > 3) {
                let odd = format!("{},{}", &digits[..digits.len() - cut], &digits[digits.len() - cut..]);
                proptest::prop_assert_eq!(number(&odd), None, "{}", odd);
            }
            // Any text: a value read with a comma equals the text without commas, and a
            // `%` is read only in a percentage.
            if number(&junk).is_some() {
                proptest::prop_assert!(!junk.contains('%'), "{}", junk);
            }
            if let Some(v) = percent(&junk) {
                if junk.contains(',') {
                    let stripped = junk.trim_end_matches('%').replace(',', "");
                    proptest::prop_assert_eq!(Some(v), stripped.parse::<f64>().ok(), "{}", junk);
                }
            }
        }
    }

    #[test]
    fn numbers_as_printed() {
        assert_eq!(number("353,169"), Some(353169.0));
        assert_eq!(number("1,234,567.5"), Some(1_234_567.5));
        assert_eq!(number("-1,000"), Some(-1000.0));
        assert!(number("nan").unwrap().is_nan());
        assert_eq!(number("x"), None);
        // A decimal comma, or a separator in no grouping a framework prints, is refused.
        for ambiguous in [
            "8,5",
            "1,2345",
            "12,34,567",
            ",5",
            "1,",
            "1,000.",
            "5%%",
            "5%5",
        ] {
            assert_eq!(number(ambiguous), None, "{ambiguous}");
            assert_eq!(percent(ambiguous), None, "{ambiguous}");
        }
        // A `%` only where the caller reads a percentage.
        assert_eq!(number("8.5%"), None);
        assert_eq!(percent("42.7%"), Some(42.7));
        assert_eq!(percent("42.7"), Some(42.7));
    }
}
