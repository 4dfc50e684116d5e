//! The checks every adapter's log tests share, so that an adapter's test module states only
//! its data: a committed log and the reader of the cell that ran it ([`Fixture`]), what the
//! whole log must read as ([`Captured`]), and the edits of it that bench must refuse or
//! still read ([`Case`], made of [`Edit`]s), each with what it must say. One function reads
//! every adapter's captured log and one reads every hostile edit, so the adapters differ
//! only in their figures and their edits, never in how those are checked.

use super::{read_all, refusal, Asked, LogEnd, LoggedStep, Reader, StepLines};

/// A framework's log committed under `tests/fixtures/frameworks`, and the reader of the
/// cell that ran it.
pub(crate) struct Fixture<S> {
    /// The file's name.
    pub file: &'static str,
    /// What the cell asked for, which the log must show it ran.
    pub asked: Asked,
    /// The adapter's reading of its framework's lines for that cell.
    pub lines: fn() -> S,
}

/// What a whole captured log reads as: its steps, some of them figure by figure, and what
/// its end says.
pub(crate) struct Captured<'a> {
    /// How many steps the log completes.
    pub steps: usize,
    /// The first step that carries the framework's own tokens/s, `None` where none does:
    /// every later step carries one too, and no earlier step does.
    pub own_tokens_from: Option<u64>,
    /// Steps that must read exactly so, every figure of them.
    pub read: &'a [LoggedStep],
    /// What the driver's version line says.
    pub name: &'static str,
    pub version: &'static str,
    pub device: &'static str,
    pub world_size: u32,
    /// Peak memory per rank, in bytes: empty where the log gives none (a CPU's `-1`).
    pub peak_mem_bytes: &'a [u64],
    /// The framework's end-of-run tokens/s per GPU, for frameworks that print no per-step
    /// throughput.
    pub run_tokens_per_s_per_gpu: Option<f64>,
}

/// A change to a captured log (or to the cell it is read for) that a hostile or damaged
/// run could make. Each text edit panics when the text it names is not in the log, so an
/// edit that stopped matching its fixture fails the test rather than reading the log as it
/// was.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Edit {
    /// The log ends before the first line that holds this (a truncated log).
    CutBefore(&'static str),
    /// The log ends right after the first place it holds this, inside that line.
    CutAfter(&'static str),
    /// The first line that holds `line` cut right after the first place it holds `after`
    /// (a line cut short; the rest of the log kept).
    Truncate {
        line: &'static str,
        after: &'static str,
    },
    /// The log starts at the first line that holds this (its head lost).
    StartAt(&'static str),
    /// Every place `from` stands replaced by `to`.
    Replace {
        from: &'static str,
        to: &'static str,
    },
    /// `line` inserted as a line of its own before the first line that holds `before`.
    Insert {
        before: &'static str,
        line: &'static str,
    },
    /// The first line that holds this written twice (a second rank's copy of it, without
    /// its rank prefix).
    Double(&'static str),
    /// The first line that holds this removed (a lost line).
    Drop(&'static str),
    /// torchrun's rank prefixes (and colour codes) removed from every line, as when the
    /// ranks run without `--role rank --tee 3`.
    Unprefixed,
    /// Several edits, in order.
    Each(&'static [Edit]),
    /// The log as it is, for a cell that asked for this many steps (flags that did not
    /// take).
    Steps(u32),
    /// The log as it is, for a cell that asked for this global batch.
    GlobalBatch(u32),
}

/// The byte offset of the start of the line that holds `marker` first.
fn line_start(text: &str, marker: &str) -> usize {
    let at = found(text, marker);
    text[..at].rfind('\n').map_or(0, |n| n + 1)
}

/// The byte offset just after the line (its newline included) that holds `marker` first.
fn line_end(text: &str, marker: &str) -> usize {
    let at = found(text, marker);
    text[at..].find('\n').map_or(text.len(), |n| at + n + 1)
}

/// `text` with `line` inserted as a line of its own at byte offset `at` (a line's start).
fn insert(text: &str, at: usize, line: &str) -> String {
    format!("{}{line}\n{}", &text[..at], &text[at..])
}

/// Where `marker` first stands in `text`; panics where it does not.
fn found(text: &str, marker: &str) -> usize {
    text.find(marker)
        .unwrap_or_else(|| panic!("the log holds no `{marker}`: the edit no longer fits it"))
}

impl Edit {
    /// `text` with this edit made, and the cell's `asked` changed where the edit says so.
    fn apply(&self, text: &str, asked: &mut Asked) -> String {
        match *self {
            Edit::CutBefore(marker) => text[..line_start(text, marker)].to_string(),
            Edit::CutAfter(marker) => text[..found(text, marker) + marker.len()].to_string(),
            Edit::Truncate { line, after } => {
                let (start, end) = (line_start(text, line), line_end(text, line));
                let cut = start + found(&text[start..end], after) + after.len();
                format!("{}\n{}", &text[..cut], &text[end..])
            }
            Edit::StartAt(marker) => text[line_start(text, marker)..].to_string(),
            Edit::Replace { from, to } => {
                found(text, from);
                text.replace(from, to)
            }
            Edit::Insert { before, line } => insert(text, line_start(text, before), line),
            Edit::Double(marker) => {
                let (start, end) = (line_start(text, marker), line_end(text, marker));
                insert(text, start, text[start..end].trim_end_matches('\n'))
            }
            Edit::Drop(marker) => {
                let (start, end) = (line_start(text, marker), line_end(text, marker));
                format!("{}{}", &text[..start], &text[end..])
            }
            Edit::Unprefixed => text
                .lines()
                .map(|l| super::split_rank(l).1 + "\n")
                .collect(),
            Edit::Each(edits) => edits
                .iter()
                .fold(text.to_string(), |t, e| e.apply(&t, asked)),
            Edit::Steps(steps) => {
                asked.steps = steps;
                text.to_string()
            }
            Edit::GlobalBatch(batch) => {
                asked.global_batch = batch;
                text.to_string()
            }
        }
    }
}

/// What bench must make of an edited log.
#[derive(Debug, Clone)]
pub(crate) enum Then {
    /// Refused, with a message that holds this.
    Refused(&'static str),
    /// Refused, with a message that holds `says`, naming a line that holds `line` (the
    /// line bench refused, as printed).
    RefusedAt {
        says: &'static str,
        line: &'static str,
    },
    /// Still read (a form of the log the framework may print), with this step among its
    /// steps, every figure of it as here.
    Reads(LoggedStep),
}

/// One edit of a captured log and what bench must make of it.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub edit: Edit,
    pub then: Then,
}

/// Whether a figure read from a log is the one expected, to the last bit (NaN where NaN is
/// expected). A figure the reader derives from printed ones is expected as the same
/// arithmetic on the printed figures (`87.12 / 1000.0` for a step llm.c printed as
/// `87.12 ms`), so no tolerance hides a misread digit.
fn same(got: f64, want: f64) -> bool {
    got == want || (got.is_nan() && want.is_nan())
}

/// [`same`] for a figure a log may lack: both absent, or both there and the same.
fn same_opt(got: Option<f64>, want: Option<f64>) -> bool {
    match (got, want) {
        (Some(g), Some(w)) => same(g, w),
        (g, w) => g.is_none() && w.is_none(),
    }
}

/// Asserts that `steps` holds `want`, every figure of it.
fn holds(steps: &[LoggedStep], want: &LoggedStep, context: &str) {
    let got = steps
        .iter()
        .find(|s| s.step == want.step)
        .unwrap_or_else(|| panic!("{context}: no step {}", want.step));
    let agree = same(got.step_time_s, want.step_time_s)
        && same(got.loss, want.loss)
        && same_opt(got.tokens_per_s_per_gpu, want.tokens_per_s_per_gpu)
        && same_opt(got.tflops_per_gpu, want.tflops_per_gpu)
        && same_opt(got.mfu, want.mfu);
    assert!(agree, "{context}: read {got:?}, expected {want:?}");
}

impl<S: StepLines> Fixture<S> {
    /// The fixture's text.
    fn text(&self) -> String {
        crate::external::tests::fixture(self.file)
    }

    /// A reader of the log of a cell that asked for `asked`.
    fn reader(&self, asked: Asked) -> Reader<S> {
        Reader::new(asked, (self.lines)())
    }

    /// Reads `text` whole, as of a framework that exited 0.
    fn read(&self, text: &str, asked: Asked) -> (Vec<LoggedStep>, LogEnd) {
        read_all(&mut self.reader(asked), text, true)
            .unwrap_or_else(|e| panic!("{}: {e}", self.file))
    }

    /// Asserts that the fixture reads as `want`: its step count, which steps carry the
    /// framework's own throughput, every figure of the steps `want` lists, and what the
    /// driver's line and the end of the log say.
    pub(crate) fn reads_as(&self, want: &Captured<'_>) {
        let file = self.file;
        let (steps, end) = self.read(&self.text(), self.asked);
        assert_eq!(steps.len(), want.steps, "{file}: steps");
        for (i, s) in steps.iter().enumerate() {
            assert_eq!(s.step, i as u64 + 1, "{file}: steps in order");
            let own = want.own_tokens_from.is_some_and(|from| s.step >= from);
            assert_eq!(
                s.tokens_per_s_per_gpu.is_some(),
                own,
                "{file}: step {}'s own tokens/s",
                s.step
            );
        }
        for step in want.read {
            holds(&steps, step, file);
        }
        let info = &end.info;
        let driver = (
            info.name.as_str(),
            info.version.as_str(),
            info.device.as_str(),
        );
        assert_eq!(driver, (want.name, want.version, want.device), "{file}");
        assert_eq!(info.world_size, want.world_size, "{file}: world size");
        assert_eq!(
            end.peak_mem_bytes, want.peak_mem_bytes,
            "{file}: peak memory"
        );
        assert!(
            same_opt(end.run_tokens_per_s_per_gpu, want.run_tokens_per_s_per_gpu),
            "{file}: run tokens/s {:?}, expected {:?}",
            end.run_tokens_per_s_per_gpu,
            want.run_tokens_per_s_per_gpu
        );
    }

    /// Asserts what bench makes of each case's edit of the fixture. The fixture itself must
    /// read first, so that each refusal is its edit's doing.
    pub(crate) fn check(&self, cases: &[Case]) {
        let text = self.text();
        self.read(&text, self.asked);
        for case in cases {
            let mut asked = self.asked;
            let edited = case.edit.apply(&text, &mut asked);
            assert!(
                edited != text || asked != self.asked,
                "{:?} leaves {} as it is",
                case.edit,
                self.file
            );
            let context = format!("{} edited by {:?}", self.file, case.edit);
            match &case.then {
                Then::Refused(says) => {
                    let e = refusal(self.reader(asked), &edited);
                    assert!(e.message.contains(says), "{context}: {e}");
                }
                Then::RefusedAt { says, line } => {
                    let e = refusal(self.reader(asked), &edited);
                    assert!(e.message.contains(says), "{context}: {e}");
                    assert!(e.line.contains(line), "{context}: {e}");
                }
                Then::Reads(step) => {
                    let (steps, _) = self.read(&edited, asked);
                    holds(&steps, step, &context);
                }
            }
        }
    }
}
