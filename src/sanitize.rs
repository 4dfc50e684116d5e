//! Untrusted text made safe to keep: worker output (its log lines, the messages and names in
//! its events) becomes a `String` in results only through [`clean`], which replaces invalid
//! UTF-8, removes terminal escape sequences (colours, cursor moves, OSC titles and links)
//! and drops every control character except newline and tab.
//!
//! What comes out can be written anywhere bench writes text: to a terminal (no escape can
//! move the cursor, recolour or retitle it), into Markdown, and into XML, whose 1.0 grammar
//! forbids the C0 controls other than tab, newline and carriage return even as character
//! references (a NUL or ESC in `junit.xml` makes the whole file unreadable to CI). Escape
//! sequences are recognised by vte's implementation of the DEC/ANSI parser state machine,
//! so a CSI with parameters, an OSC ended by BEL or ST and a DCS string are each removed
//! whole rather than leaving their parameter text behind.
//!
//! [`xml_chars`] is the last guard of XML writers: it removes only what XML cannot hold,
//! for text that may not have come through [`clean`] (a results file written by an older
//! bench, or edited by hand).
//!
//! [`bounded`] cuts one text bench did not write to [`MAX_SHOWN_CHARS`] characters where
//! it is shown (the site's pages, the terminal and Markdown reports, `junit.xml`), and
//! [`bounded_json`] every string of a page's embedded data, so that an output's size
//! follows the number of its cells and runs, not its longest stored text.

use std::borrow::Cow;

/// Collects what a terminal would show, minus control characters.
struct Printable {
    out: String,
}

impl vte::Perform for Printable {
    fn print(&mut self, c: char) {
        if !is_unsafe_char(c) {
            self.out.push(c);
        }
    }

    fn execute(&mut self, byte: u8) {
        // Of the C0/C1 controls only line structure survives; a carriage return (progress
        // bars redrawing a line) would make a terminal overwrite what came before it.
        if byte == b'\n' || byte == b'\t' {
            self.out.push(byte as char);
        }
    }
}

/// Characters that are never kept: controls (C0, DEL, C1), the two noncharacters XML
/// forbids, and the bidirectional controls and line separators ([`is_bidi_or_separator`]).
fn is_unsafe_char(c: char) -> bool {
    c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' || is_bidi_or_separator(c)
}

/// The characters that reorder or break what a reader sees without being seen themselves:
/// the bidirectional embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069;
/// "Trojan Source", CVE-2021-42574), the directional marks (U+200E, U+200F, U+061C), and
/// the line and paragraph separators (U+2028, U+2029), which end a line where none shows.
/// A commit subject or matrix name holding one could make a terminal or a comment show
/// text in another order than it has.
pub(crate) fn is_bidi_or_separator(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{061C}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Worker bytes as safe text: invalid UTF-8 replaced by U+FFFD, escape sequences and
/// control characters other than `\n` and `\t` removed.
pub(crate) fn clean_bytes(bytes: &[u8]) -> String {
    clean(&String::from_utf8_lossy(bytes))
}

/// Text as safe text (see [`clean_bytes`]); borrowed when there was nothing to remove,
/// which is the common case of a worker's plain log line.
pub fn clean(text: &str) -> String {
    if !text
        .chars()
        .any(|c| is_unsafe_char(c) && c != '\n' && c != '\t')
    {
        return text.to_string();
    }
    let mut p = Printable {
        out: String::with_capacity(text.len()),
    };
    vte::Parser::new().advance(&mut p, text.as_bytes());
    p.out
}

/// Removes what XML 1.0 cannot hold in any form (C0 controls other than tab, newline and
/// carriage return; U+FFFE, U+FFFF) from a rendered document or fragment; everything else,
/// markup included, is left as it is.
pub fn xml_chars(xml: &str) -> Cow<'_, str> {
    let bad = |c: char| {
        (c < ' ' && c != '\t' && c != '\n' && c != '\r') || c == '\u{FFFE}' || c == '\u{FFFF}'
    };
    if xml.chars().any(bad) {
        Cow::Owned(xml.chars().filter(|c| !bad(*c)).collect())
    } else {
        Cow::Borrowed(xml)
    }
}

/// Text for a terminal with every control character shown, not acted on: stored text
/// (a history's reasons, run ids, host names, written by whoever shares the store) may
/// hold an escape that would retitle or clear the reader's terminal. Newlines and tabs stay
/// (the layout of what bench prints); every other C0/C1 control and DEL is written as
/// `\x1b` / `\u{9b}`, so the reader sees that it was there.
pub fn terminal(text: &str) -> Cow<'_, str> {
    let shown = |c: char| (c.is_control() && c != '\n' && c != '\t') || is_bidi_or_separator(c);
    if !text.chars().any(shown) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if shown(c) {
            if (c as u32) < 0x80 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A value from outside (a command-line argument such as a cell id, a stored id) as it is
/// shown inside one line of a message: [`terminal`], with newlines, carriage returns and
/// tabs written as `\n`, `\r` and `\t` too, so that a value cannot start a line of its
/// own that reads as bench's (`bench history $'x\nerror: ...'`).
pub fn inline(text: &str) -> Cow<'_, str> {
    if !text.contains(['\n', '\r', '\t']) {
        return terminal(text);
    }
    let escaped = text
        .replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace('\t', "\\t");
    Cow::Owned(terminal(&escaped).into_owned())
}

/// The most characters of one stored text (a commit subject, an author, a reason, a kernel
/// name, an id) a page or report shows: far above any real one (C++ kernel names run to a
/// few hundred), so that one hostile 50 MB subject cannot make a 100 MB page.
pub const MAX_SHOWN_CHARS: usize = 2_000;

/// `text` cut to at most `max` characters, saying how many were left out; borrowed when it
/// is short enough, which is every real text.
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((at, _)) => {
            let left = text[at..].chars().count();
            let s = if left == 1 { "" } else { "s" };
            Cow::Owned(format!("{}… ({left} more character{s})", &text[..at]))
        }
    }
}

/// `data` as JSON with every string in it cut to [`MAX_SHOWN_CHARS`] ([`bounded`]), for
/// the data a page embeds (`bench site`'s pages and tables, `report.html`): their texts
/// are whatever a store's or a results file's writers put there, and a page's size must
/// follow the number of its cells and runs, not its longest commit subject or reason.
/// Keys keep their order (serde_json's `preserve_order`).
pub fn bounded_json(data: &impl serde::Serialize) -> serde_json::Result<String> {
    fn cut(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let Cow::Owned(b) = bounded(s, MAX_SHOWN_CHARS) {
                    *s = b;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(cut),
            serde_json::Value::Object(o) => o.values_mut().for_each(cut),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(data)?;
    cut(&mut v);
    serde_json::to_string(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidirectional_controls_are_shown_or_removed_never_acted_on() {
        assert_eq!(terminal("a\u{202e}evil"), "a\\u{202e}evil");
        assert_eq!(clean("ev\u{202e}il\u{2066}x\u{2028}y"), "evilxy");
        assert_eq!(clean("plain ✓ é"), "plain ✓ é");
    }

    #[test]
    fn a_long_text_is_cut_on_a_character_boundary_saying_how_much_is_left() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("ééééé", 2), "éé… (3 more characters)");
        assert!(matches!(bounded("abc", 3), Cow::Borrowed(_)));
    }

    #[test]
    fn embedded_data_has_every_string_cut_and_its_keys_in_order() {
        let long = "z".repeat(MAX_SHOWN_CHARS + 1);
        let json = bounded_json(&serde_json::json!({"b": [long], "a": 1.5})).unwrap();
        let cut = format!("{}… (1 more character)", "z".repeat(MAX_SHOWN_CHARS));
        assert_eq!(json, format!("{{\"b\":[\"{cut}\"],\"a\":1.5}}"));
    }

    #[test]
    fn terminal_text_shows_controls_instead_of_acting_on_them() {
        assert_eq!(terminal("plain ✓\n\tx"), "plain ✓\n\tx");
        assert_eq!(
            terminal("a\x1b]0;pwned\x07b\x1b[2J\u{9b}c\r"),
            "a\\x1b]0;pwned\\x07b\\x1b[2J\\u{9b}c\\x0d"
        );
    }

    #[test]
    fn colours_and_cursor_moves_are_removed_whole() {
        assert_eq!(
            clean("\x1b[1;31merror\x1b[0m: CUDA out of memory"),
            "error: CUDA out of memory"
        );
        assert_eq!(clean("50%\x1b[2K\x1b[1G100%"), "50%100%");
        // An OSC title ended by BEL, and an OSC 8 hyperlink ended by ST.
        assert_eq!(clean("\x1b]0;pwned\x07ok"), "ok");
        assert_eq!(
            clean("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ text"),
            "link text"
        );
        // A DCS string and a lone ESC at the end.
        assert_eq!(clean("a\x1bP1$r0m\x1b\\b\x1b"), "ab");
    }

    #[test]
    fn controls_go_and_layout_stays() {
        assert_eq!(clean("a\0b\x07c\x08d\re\x7ff"), "abcdef");
        assert_eq!(clean("col1\tcol2\nnext"), "col1\tcol2\nnext");
        assert_eq!(clean("c1 \u{85}\u{9b}31m x"), "c1 31m x");
        assert_eq!(clean("non\u{FFFF}char"), "nonchar");
        assert_eq!(clean("plain ünïcode ✓"), "plain ünïcode ✓");
    }

    #[test]
    fn invalid_utf8_is_replaced_not_dropped() {
        assert_eq!(
            clean_bytes(b"loss \xff\xfe 7.1"),
            "loss \u{FFFD}\u{FFFD} 7.1"
        );
        // A character cut at the end of the line is replaced too.
        assert_eq!(clean_bytes(b"tail \xe2\x9c"), "tail \u{FFFD}");
        assert_eq!(clean_bytes(b"\x1b[31m\xff\x1b[0m"), "\u{FFFD}");
    }

    #[test]
    fn xml_chars_keeps_markup_and_drops_what_xml_forbids() {
        assert_eq!(
            xml_chars("<a x=\"1\">t\tu\r\nv</a>"),
            "<a x=\"1\">t\tu\r\nv</a>"
        );
        assert_eq!(xml_chars("<a>\0\x1b[0m\u{FFFE}</a>"), "<a>[0m</a>");
    }

    #[test]
    fn an_inline_value_cannot_start_a_line() {
        assert_eq!(inline("a.b_c"), "a.b_c");
        assert_eq!(
            inline("cell\nerror: forged\r\tx\x1b]0;t\x07"),
            "cell\\nerror: forged\\r\\tx\\x1b]0;t\\x07"
        );
        assert!(!inline("x\ny").contains('\n'));
    }
}
