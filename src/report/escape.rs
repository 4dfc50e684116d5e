//! Untrusted text in Markdown that people read (`summary.md`, the PR/MR comment,
//! `frameworks.md`, `history.md`): every value a report did not write itself (cell ids, axis
//! values, the matrix's name, failure reasons, a framework's name, version and words)
//! goes through one of these, so that it shows as written and does nothing else.
//!
//! - [`text`] for prose and table cells: one line, without terminal escapes or control
//!   characters (a reader may `cat summary.md`); `&`, `<`, `>` as entities (never HTML,
//!   an `<img>` or a `<details>` of its own); a backslash before every other Markdown
//!   special (`` ` ``, `|`, `\`, `[`, `]`, `(`, `)`, `*`, `_`, `!`, `~`, `#`, `$`), so a
//!   commit subject's `[c](javascript:alert(1))` is its characters, not a link, and nothing
//!   starts emphasis, a code span or an image or ends a table cell (CommonMark 2.4 lets any
//!   ASCII punctuation be escaped so); and a zero-width joiner after every `@`, so that
//!   `@octocat` or `@org/team` notifies nobody (GitHub and GitLab only mention a name right
//!   after the `@`).
//! - [`code`] for a value shown as code: a code span whose fence is longer than any run of
//!   backticks inside, so no backtick in the value can end it (CommonMark 6.1); inside a
//!   code span nothing is HTML, a mention or a link. [`code_cell`] is the same inside a
//!   table row, where `|` must be escaped even in code. Control characters and terminal
//!   escapes are removed from a code span as from prose.
//!
//! Every one of them first cuts its value to [`crate::sanitize::MAX_SHOWN_CHARS`]
//! characters ([`crate::sanitize::bounded`], as `bench site` cuts the store's texts): a
//! 50 MB commit subject in a triage.json, or matrix name or failure reason in a
//! results.json, then shows as its first 2,000 characters and how many more there were,
//! and `summary.md`'s size follows the number of cells, not the longest text.
//!
//! It sits beside the sinks rather than inside [`super::markdown`]: the history and
//! framework reports escape with it too, and the Markdown summary includes the history
//! report, so inside `markdown` it made the two import each other.

use crate::report::text::one_line;
use crate::sanitize::{bounded, MAX_SHOWN_CHARS};

/// Untrusted text as Markdown prose or a table cell's text (see the module doc).
pub(crate) fn text(s: &str) -> String {
    let line = one_line(&crate::sanitize::clean(&bounded(s, MAX_SHOWN_CHARS)));
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            // Every Markdown special that can open or close something: links and images
            // (`[`, `]`, `(`, `)`, `!`), emphasis and strikethrough (`*`, `_`, `~`), code
            // spans, table cells, escapes, issue references and GitHub's `$` maths.
            '`' | '|' | '\\' | '[' | ']' | '(' | ')' | '*' | '_' | '!' | '~' | '#' | '$' => {
                out.push('\\');
                out.push(c);
            }
            '@' => out.push_str("@\u{200D}"),
            c => out.push(c),
        }
    }
    out
}

/// Untrusted text inside HTML, in an element's text or a quoted attribute: `&`, `<`, `>`,
/// `"` and `'` as entities (report.html's title, the fleet's report.html).
pub(crate) fn html(s: &str) -> String {
    bounded(s, MAX_SHOWN_CHARS)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Untrusted text as an inline code span (see the module doc); outside a table.
pub(crate) fn code(s: &str) -> String {
    let line = one_line(&crate::sanitize::clean(&bounded(s, MAX_SHOWN_CHARS)));
    if line.is_empty() {
        // An empty span is not a code span; one space is.
        return "` `".into();
    }
    let longest = line.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    // A span's content loses one space at each end when it has one at both (and a value
    // beginning or ending with a backtick needs the space to stay apart from the fence);
    // `one_line` already removed spaces at the ends, so padding both keeps the value whole.
    let pad = if line.starts_with('`') || line.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{line}{pad}{fence}")
}

/// [`code`] inside a table row: a `|` would end the cell even inside a code span, so it is
/// escaped (GitHub Flavored Markdown shows `\|` in a table's code span as `|`).
pub(crate) fn code_cell(s: &str) -> String {
    code(s).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prose_carries_no_html_mention_link_or_cell_break() {
        assert_eq!(
            text("a | b\n<script>x</script> & c"),
            "a \\| b &lt;script&gt;x&lt;/script&gt; &amp; c"
        );
        assert_eq!(
            text("ping @octocat and @org/team"),
            "ping @\u{200D}octocat and @\u{200D}org/team"
        );
        assert_eq!(
            text("x` <img src=x onerror=alert(1)> [y](https://e.x)"),
            "x\\` &lt;img src=x onerror=alert\\(1\\)&gt; \\[y\\]\\(https://e.x\\)"
        );
    }

    #[test]
    fn prose_carries_no_link_emphasis_image_or_terminal_escape() {
        assert_eq!(
            text("fix [c](javascript:alert(1)) ![i](x.png) *b* _e_ ~s~"),
            "fix \\[c\\]\\(javascript:alert\\(1\\)\\) \\!\\[i\\]\\(x.png\\) \\*b\\* \\_e\\_ \\~s\\~"
        );
        assert_eq!(text("a\x1b]0;pwned\x07b\x1b[2Jc\u{9b}d"), "abcd");
        assert_eq!(code("k\x1b[31m_x"), "`k_x`");
    }

    #[test]
    fn a_long_value_is_cut_in_every_form() {
        let long = "y".repeat(MAX_SHOWN_CHARS + 5);
        let cut = format!("{}… \\(5 more characters\\)", "y".repeat(MAX_SHOWN_CHARS));
        assert_eq!(text(&long), cut);
        assert!(code(&long).ends_with("… (5 more characters)`"));
        assert!(html(&long).ends_with("… (5 more characters)"));
    }

    #[test]
    fn a_backtick_cannot_end_the_code_span() {
        assert_eq!(code("gpt2.bf16"), "`gpt2.bf16`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("x`` <img src=x>"), "```x`` <img src=x>```");
        assert_eq!(code("`start"), "`` `start ``");
        assert_eq!(code("end`"), "`` end` ``");
        assert_eq!(code(""), "` `");
        assert_eq!(code("two\nlines"), "`two lines`");
        assert_eq!(code_cell("a|b`"), "`` a\\|b` ``");
    }
}
