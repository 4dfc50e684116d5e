//! Reading a log file line by line in bounded memory.
//!
//! A log handed to `bench ingest` comes from somewhere else and may be anything: a Slurm
//! output file, a truncated copy, a binary file given by mistake, or a file with one line of
//! a gigabyte. The reader keeps at most [`MAX_LINE_BYTES`] of a line and stops with the
//! file and line number as soon as a line is longer (no training framework prints a step
//! line anywhere near that long, so such a file is not a log we can trust) or a NUL byte
//! shows that the file is not text. Carriage returns split lines too: a progress bar
//! (NeMo's tqdm bar) rewrites its line with `\r`, so one physical line of a log file holds
//! many updates; they keep the physical line's number.

use std::io::{BufRead, BufReader, Read};

use super::error::IngestError;

/// The longest line read (the same bound the runner puts on a worker's line).
pub(crate) const MAX_LINE_BYTES: usize = crate::events::MAX_LINE_BYTES;

/// Calls `each(line_no, text)` for every line of `input` (1-based physical line numbers;
/// the `\r`-separated updates of a progress bar share theirs). `path` names the file in
/// errors. Stops at the first error `each` returns.
pub(crate) fn for_each_line(
    path: &str,
    input: impl Read,
    mut each: impl FnMut(usize, &str) -> Result<(), IngestError>,
) -> Result<(), IngestError> {
    let mut reader = BufReader::with_capacity(64 * 1024, input);
    let mut line: Vec<u8> = Vec::new();
    let mut line_no = 1usize;
    // Whether the current physical line has produced any segment yet, so an empty file
    // produces nothing and a trailing newline no extra empty line.
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(IngestError::Read {
                    path: path.to_string(),
                    source,
                })
            }
        };
        if buf.is_empty() {
            break;
        }
        let mut used = 0;
        for (i, &b) in buf.iter().enumerate() {
            match b {
                0 => {
                    return Err(IngestError::at(
                        path,
                        line_no,
                        "",
                        format!(
                            "a NUL byte at byte {} of the line: this is not a text log (a binary file?)",
                            line.len()
                        ),
                    ))
                }
                b'\n' | b'\r' => {
                    emit(&mut line, line_no, &mut each)?;
                    if b == b'\n' {
                        line_no += 1;
                    }
                }
                _ => {
                    if line.len() >= MAX_LINE_BYTES {
                        return Err(IngestError::at(
                            path,
                            line_no,
                            "",
                            format!(
                                "the line is longer than {MAX_LINE_BYTES} bytes: no framework prints a step line that long, so this is not a log bench can read (bench stops reading here)"
                            ),
                        ));
                    }
                    line.push(b);
                }
            }
            used = i + 1;
        }
        reader.consume(used);
    }
    emit(&mut line, line_no, &mut each)
}

fn emit(
    line: &mut Vec<u8>,
    line_no: usize,
    each: &mut impl FnMut(usize, &str) -> Result<(), IngestError>,
) -> Result<(), IngestError> {
    if line.is_empty() {
        return Ok(());
    }
    // Escapes and control characters go (colour codes around numbers would break them);
    // invalid UTF-8 becomes U+FFFD, which no number contains.
    let text = crate::sanitize::clean_bytes(line);
    line.clear();
    each(line_no, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Result<Vec<(usize, String)>, IngestError> {
        let mut out = Vec::new();
        for_each_line("log", input, |n, t| {
            out.push((n, t.to_string()));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn lines_and_progress_bar_updates_keep_physical_numbers() {
        let got = lines(b"a\nb\rc\r\n\nd").unwrap();
        assert_eq!(
            got,
            vec![
                (1, "a".into()),
                (2, "b".into()),
                (2, "c".into()),
                (4, "d".into())
            ]
        );
        assert!(lines(b"").unwrap().is_empty());
    }

    #[test]
    fn binary_and_endless_lines_stop_with_the_line_number() {
        let e = lines(b"ok\nstill ok\nbin\0ary").unwrap_err().to_string();
        assert!(e.starts_with("log:3: a NUL byte"), "{e}");
        // A gigabyte line costs the reader one megabyte: it stops at the bound.
        let endless = std::io::repeat(b'x').take(1 << 30);
        let mut seen = 0;
        let e = for_each_line("big.log", endless, |_, _| {
            seen += 1;
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("big.log:1: the line is longer than"), "{e}");
        assert_eq!(seen, 0);
    }

    #[test]
    fn colour_codes_are_removed() {
        let got = lines(b"\x1b[32mstep 1\x1b[0m\n").unwrap();
        assert_eq!(got, vec![(1, "step 1".into())]);
    }
}
