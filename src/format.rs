//! Output vocabulary shared by the command line and every stage that prints: which form a
//! command's terminal output takes. It sits below the stages that use it (the runner, the
//! environment probe, the reports, the command layer), so none of them imports another for
//! it. The number formatting every report and the judge's verdict words share lives here
//! too, so that a figure reads the same wherever it is written.

/// What a command prints on the terminal: the human summary or JSON. It derives clap's
/// `ValueEnum` (as the axes types do) so the command line parses straight into it, and
/// the reports never see a clap struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Format {
    #[default]
    Human,
    Json,
}

/// A number with an SI suffix and three significant digits: `344K`, `43.6K`, `1.23M`.
pub(crate) fn si(v: f64) -> String {
    let (scaled, suffix) = si_scaled(v);
    format!("{}{suffix}", three_digits(scaled))
}

/// `v` scaled to below a thousand, with the SI suffix that undoes it (`K`, `M`, `G`, `T`;
/// none below a thousand).
pub(crate) fn si_scaled(v: f64) -> (f64, &'static str) {
    let a = v.abs();
    if a >= 1e12 {
        (v / 1e12, "T")
    } else if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    }
}

/// Three significant digits, no exponent: `1.23`, `12.3`, `123`.
pub(crate) fn three_digits(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A relative change as a signed percentage: `+1.2%`, `-5.0%`.
pub(crate) fn pct_change(change: f64) -> String {
    format!("{:+.1}%", change * 100.0)
}
