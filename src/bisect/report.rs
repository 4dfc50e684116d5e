//! What a bisection prints: a progress line on stderr as each commit is decided, then on
//! stdout the first bad commit with its evidence and the table of measured commits (or
//! why there is none), in human form or as one JSON document (`--format json`).

use serde::Serialize;

use super::bisection::{Bisection, Ending, Probe, Role};
use super::git::Commit;
use super::probe::BRANCH;
use super::search::{max_probes, Side};
use crate::error::CliError;
use crate::format::Format;
use crate::history::cmd::human;
use crate::history::gate::METRIC;
use crate::history::twosample::TwoSample;

/// A subject cut to `n` characters for a table.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", x * 100.0)
}

/// The interval of a comparison, or why there is none.
fn interval(t: &TwoSample) -> String {
    match t.ci_rel {
        Some((lo, hi)) if lo.is_finite() && hi.is_finite() => format!(
            "{:.0}% interval {} .. {}",
            t.ci_level * 100.0,
            pct(lo),
            pct(hi)
        ),
        _ => "too few repeats for an interval".to_string(),
    }
}

fn median_text(p: &Probe) -> String {
    p.median().map_or("-".into(), human)
}

/// The line that opens a bisection (stderr).
pub(crate) fn header(b: &Bisection) -> String {
    format!(
        "bisect: {} over the {} commit(s) of {}..{} (first-parent): at most {} measured; probes recorded in {} (branch `{BRANCH}`, hardware key {})",
        b.settings.cell,
        b.n(),
        b.good.short(),
        b.bad.short(),
        max_probes(b.n()),
        b.history,
        b.hardware_key
    )
}

/// The line printed when a commit is decided (stderr).
pub(crate) fn progress_line(b: &Bisection, p: &Probe) -> String {
    let label = match p.role {
        Role::Good => "good".to_string(),
        Role::Bad => "bad".to_string(),
        Role::Probe => format!(
            "probe {}/{}",
            b.probes.iter().filter(|q| q.role == Role::Probe).count() + 1,
            super::search::ceil_log2(b.n())
        ),
    };
    let reused = p.rounds.iter().filter(|r| r.reused).count();
    let repeats = format!(
        "{} repeats{}",
        p.samples().len(),
        if reused > 0 {
            format!(", {reused} round(s) from the history")
        } else {
            String::new()
        }
    );
    let head = format!(
        "bisect: {label:<9} {} {:<40} {:>7} tok/s",
        p.commit.short(),
        cut(&p.commit.subject, 40),
        median_text(p)
    );
    match (&p.vs_good, p.role) {
        (Some(t), _) => format!(
            "{head}  {} vs good: {}, p={:.4} ({repeats}) -> {}",
            pct(t.shift_rel),
            t.answer.as_str(),
            t.p_value,
            p.side.map_or("unknown", Side::as_str)
        ),
        (None, _) => format!("{head}  ({repeats})"),
    }
}

/// Why good and bad could not be told apart.
pub(crate) fn undecided_endpoints(b: &Bisection, good: &Probe, bad: &Probe) -> String {
    let figures = bad.vs_good.as_ref().map_or(String::new(), |t| {
        format!(
            ": bad is {} against good ({}), p={:.4}",
            pct(t.shift_rel),
            interval(t),
            t.p_value
        )
    });
    format!(
        "cannot tell good ({}) from bad ({}) after {} and {} repeats (--max-repeats {}){figures}; the change is smaller than the noise allows to see, or the host is noisy",
        good.commit.short(),
        bad.commit.short(),
        good.samples().len(),
        bad.samples().len(),
        b.settings.max_repeats
    )
}

/// Why a probe could not be called good or bad.
pub(crate) fn undecided_probe(b: &Bisection, p: &Probe) -> String {
    let vs = |name: &str, t: &Option<TwoSample>| {
        t.as_ref().map_or(String::new(), |t| {
            format!(
                "; against {name}: {} ({}), {}, p={:.4}",
                pct(t.shift_rel),
                interval(t),
                t.answer.as_str(),
                t.p_value
            )
        })
    };
    format!(
        "cannot decide commit {} ({}) after {} repeats (--max-repeats {}): median {} tok/s{}{}",
        p.commit.short(),
        p.commit.subject,
        p.samples().len(),
        b.settings.max_repeats,
        median_text(p),
        vs("good", &p.vs_good),
        vs("bad", &p.vs_bad)
    )
}

/// The message of an interrupted bisection (stderr).
pub(crate) fn interrupted(b: &Bisection) -> String {
    format!(
        "bisect: interrupted; the rounds measured so far are recorded in {} (branch `{BRANCH}`): run the same command again to resume from them",
        b.history
    )
}

/// One measured commit in the JSON document.
#[derive(Debug, Serialize)]
struct ProbeDoc<'a> {
    commit: &'a Commit,
    role: Role,
    /// Position in the range: 0 is good, `commits` is bad.
    position: usize,
    side: Option<Side>,
    median: Option<f64>,
    samples: Vec<f64>,
    rounds: usize,
    /// Rounds found in the history instead of measured by this invocation.
    reused_rounds: usize,
    run_ids: Vec<&'a str>,
    vs_good: Option<TwoSample>,
    vs_bad: Option<TwoSample>,
}

/// The JSON document of `bench bisect --format json`.
#[derive(Debug, Serialize)]
struct Doc<'a> {
    cell: &'a str,
    metric: &'static str,
    matrix: String,
    hardware_key: &'a str,
    history: &'a str,
    branch: &'static str,
    good: &'a Commit,
    bad: &'a Commit,
    /// Commits in `good..bad` (first-parent), bad included.
    commits: usize,
    /// `ceil(log2(commits)) + 2`.
    max_probes: usize,
    /// `found`, `same`, `undecided` or `failed`.
    outcome: &'static str,
    message: Option<String>,
    first_bad: Option<&'a Commit>,
    last_good: Option<&'a Commit>,
    /// The first bad commit against good.
    evidence: Option<TwoSample>,
    /// Every measured commit, in the order they were decided.
    probes: Vec<ProbeDoc<'a>>,
}

/// The probe at `position`, when it was measured.
fn at<'a>(b: &'a Bisection, position: usize) -> Option<&'a Probe> {
    b.probes.iter().find(|p| p.position == position)
}

fn doc<'a>(b: &'a Bisection<'a>, ending: &Ending) -> Doc<'a> {
    let (outcome, message, first_bad, last_good) = match ending {
        Ending::Found {
            first_bad,
            last_good,
        } => ("found", None, Some(*first_bad), Some(*last_good)),
        Ending::Same => ("same", Some(same_message(b)), None, None),
        Ending::Undecided(m) => ("undecided", Some(m.clone()), None, None),
        Ending::Failed(m) => ("failed", Some(m.clone()), None, None),
        Ending::OutOfBudget(m) => ("out_of_budget", Some(m.clone()), None, None),
    };
    Doc {
        cell: &b.settings.cell,
        metric: METRIC,
        matrix: b.settings.matrix.display().to_string(),
        hardware_key: &b.hardware_key,
        history: &b.history,
        branch: BRANCH,
        good: &b.good,
        bad: &b.bad,
        commits: b.n(),
        max_probes: max_probes(b.n()),
        outcome,
        message,
        first_bad: first_bad.map(|p| b.commit_at(p)),
        last_good: last_good.map(|p| b.commit_at(p)),
        evidence: first_bad.and_then(|p| at(b, p)).and_then(|p| p.vs_good),
        probes: b
            .probes
            .iter()
            .map(|p| ProbeDoc {
                commit: &p.commit,
                role: p.role,
                position: p.position,
                side: p.side,
                median: p.median(),
                samples: p.samples(),
                rounds: p.rounds.len(),
                reused_rounds: p.rounds.iter().filter(|r| r.reused).count(),
                run_ids: p.rounds.iter().map(|r| r.run_id.as_str()).collect(),
                vs_good: p.vs_good,
                vs_bad: p.vs_bad,
            })
            .collect(),
    }
}

pub(crate) fn same_message(b: &Bisection) -> String {
    let figures = at(b, b.n())
        .and_then(|p| p.vs_good.as_ref())
        .map_or(String::new(), |t| {
            format!(
                ": bad is {} against good ({}), p={:.4}, {} vs {} repeats, inside the {:.0}% floor",
                pct(t.shift_rel),
                interval(t),
                t.p_value,
                t.n_after,
                t.n_before,
                b.policy.floor_rel * 100.0
            )
        });
    format!(
        "good and bad are the same: {} and {} measure alike{figures}; nothing to bisect",
        b.good.short(),
        b.bad.short()
    )
}

/// The table of measured commits in the order of the range.
fn table(b: &Bisection) -> String {
    let mut rows: Vec<&Probe> = b.probes.iter().collect();
    rows.sort_by_key(|p| p.position);
    let mut out = format!(
        "  {:<10}  {:<5}  {:<40}  {:>9}  {:>8}  {:<9}  {:>7}  {:>7}  {:<5}\n",
        "commit", "role", "subject", "tok/s", "vs good", "answer", "p", "repeats", "side"
    );
    for p in rows {
        let (shift, answer, pv) = match &p.vs_good {
            Some(t) => (
                pct(t.shift_rel),
                t.answer.as_str().to_string(),
                format!("{:.4}", t.p_value),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let role = match p.role {
            Role::Good => "good",
            Role::Bad => "bad",
            Role::Probe => "probe",
        };
        out.push_str(&format!(
            "  {:<10}  {:<5}  {:<40}  {:>9}  {:>8}  {:<9}  {:>7}  {:>7}  {:<5}\n",
            p.commit.short(),
            role,
            cut(&p.commit.subject, 40),
            median_text(p),
            shift,
            answer,
            pv,
            p.samples().len(),
            p.side.map_or("?", Side::as_str)
        ));
    }
    out
}

fn human_report(b: &Bisection, ending: &Ending) -> String {
    let mut out = String::new();
    match ending {
        Ending::Found {
            first_bad,
            last_good,
        } => {
            let c = b.commit_at(*first_bad);
            out.push_str(&format!("first bad commit: {}\n", c.sha));
            out.push_str(&format!("  subject: {}\n", c.subject));
            out.push_str(&format!("  author:  {}\n", c.author));
            if let (Some(p), Some(g)) = (at(b, *first_bad), at(b, 0)) {
                if let Some(t) = &p.vs_good {
                    out.push_str(&format!(
                        "  {METRIC}: {} against {} at good: {} ({}), p={:.4}, {} vs {} repeats\n",
                        median_text(p),
                        median_text(g),
                        pct(t.shift_rel),
                        interval(t),
                        t.p_value,
                        t.n_after,
                        t.n_before
                    ));
                }
            }
            let g = b.commit_at(*last_good);
            out.push_str(&format!(
                "  last good commit: {} ({})\n",
                g.sha,
                cut(&g.subject, 60)
            ));
        }
        Ending::Same => out.push_str(&format!("{}\n", same_message(b))),
        Ending::Undecided(m) | Ending::Failed(m) | Ending::OutOfBudget(m) => {
            out.push_str(&format!("{m}\n"))
        }
    }
    out.push('\n');
    out.push_str(&table(b));
    out.push_str(&format!(
        "\n{} commit(s) measured (at most {} for the {} commit(s) of {}..{}, first-parent); probe runs in {}, recorded in {} (branch `{BRANCH}`)\n",
        b.probes.len(),
        max_probes(b.n()),
        b.n(),
        b.good.short(),
        b.bad.short(),
        b.runs_dir.display(),
        b.history
    ));
    out
}

/// Prints the final report on stdout; a closed pipe is not a failure.
pub(crate) fn print(b: &Bisection, ending: &Ending, format: Format) -> Result<(), CliError> {
    let text = match format {
        Format::Human => human_report(b, ending),
        Format::Json => {
            // Stdout holds only the document; why there is no answer goes to stderr too.
            if let Some(m) = doc(b, ending).message {
                eprintln!("bisect: {m}");
            }
            let mut s = serde_json::to_string_pretty(&doc(b, ending))
                .map_err(|e| CliError::internal(miette::miette!("{e}")))?;
            s.push('\n');
            s
        }
    };
    // A closed pipe ends bench with 141, as it ends every other command.
    crate::exit::write_stdout(&text)
        .map_err(|e| CliError::internal(miette::miette!("cannot write output: {e}")))
}
