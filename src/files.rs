//! Opening a file bench was given by path (by a user, or named inside a run folder) as a
//! regular file, and reading it with a size bound.
//!
//! A path can name anything: a FIFO (an open for reading blocks until a writer comes, so
//! bench would wait forever), a device or a link to one (`/dev/zero` never ends, and
//! reading it whole takes all memory), a directory. [`open_regular`] opens without
//! blocking (`O_NONBLOCK`, which a FIFO honours at open), checks what was opened with
//! `fstat` (after links are followed, on the very file that is then read, so nothing can
//! be swapped in between) and refuses anything but a regular file; [`read_bounded`] and
//! [`read_to_string_bounded`] read such a file up to a limit and refuse a larger one.
//! Every read of a user-given path goes through here.
//!
//! A path bench is told to write into (`-o`, `--results-dir`, `--work-dir`, the
//! `--baselines` that `bench baseline update` writes) is checked by [`output_folder`] and
//! [`output_file`] before the command does any work: a dangling link, a file where a folder
//! must be, or a place nobody can write is the user's to fix (exit 2, naming the flag and
//! the path), where it used to surface as an internal failure (exit 3, "File exists") after
//! the work was done.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// The largest results document (`results.json`) or journal read: a run of thousands of
/// cells with every step's time is a few tens of megabytes.
pub const MAX_RESULTS_BYTES: u64 = 256 * MIB;
/// The largest baseline file, matrix, event file or other small configuration read.
pub const MAX_CONFIG_BYTES: u64 = 16 * MIB;

/// What was found at a path instead of a regular file, in words.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO (named pipe): reading it would wait for a writer"
    } else if ft.is_char_device() {
        "a character device: it may never end"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

/// Opens `path` for reading if, after following links, it is a regular file; anything
/// else is an `InvalidInput` error saying what it is. Never blocks on a FIFO.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "not a regular file but {}; bench reads regular files only",
                kind_of(meta.file_type())
            ),
        ));
    }
    // O_NONBLOCK stays set: it has no effect on reads of a regular file.
    Ok(file)
}

/// Opens (creating it if absent) `path` for appending, if it is a regular file; never
/// blocks on a FIFO someone put there (`O_NONBLOCK`: with no reader the open fails at once,
/// with one the `fstat` check refuses it) and does not follow a link at the last component
/// (`O_NOFOLLOW`), so a writer never appends to something it did not create as a file.
pub fn open_append_regular(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ENXIO) => std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a FIFO (named pipe), not the regular file bench writes",
            ),
            Some(nix::libc::ELOOP) => std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a symbolic link, not the regular file bench writes",
            ),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{}; bench writes regular files only",
                kind_of(meta.file_type())
            ),
        ));
    }
    Ok(file)
}

/// The error of a file larger than `limit`.
fn too_large(limit: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "larger than {} MiB, more than any file of this kind bench writes",
            limit / MIB
        ),
    )
}

/// Reads a regular file whole, refusing one larger than `limit` bytes (checked on its
/// size and again while reading, so a file that grows is still bounded).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    read_open_bounded(file, limit)
}

/// [`read_bounded`] of an already opened file.
pub fn read_open_bounded(file: File, limit: u64) -> std::io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if size > limit {
        return Err(too_large(limit));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_to_string_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// A JSON document of a run folder that may be absent (`shard.json`, `triage.json`,
/// `history.json`, `fleet.json`): `Ok(None)` when nothing is at `path`, else the document.
/// A file that is there and does not read (too large, not UTF-8, a FIFO, a link that leads
/// nowhere, malformed, a string where a number belongs) is an error naming it, with the
/// line and column of a JSON error: each of these files holds what a silent skip would
/// lose or change, so every reader refuses it alike.
pub fn read_json_if_there<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Option<T>, String> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let text = read_to_string_bounded(path, MAX_RESULTS_BYTES)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map(Some).map_err(|e| {
        format!(
            "{}: line {} column {}: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

/// Why a path bench was told to write to cannot take what the command writes. Each names
/// the flag and the path as given, and says which part of the path is at fault.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{flag} {path}: {link}a symbolic link to {target}, which does not exist: give a folder, or remove the link")]
    Dangling {
        flag: &'static str,
        path: String,
        /// Empty when the link is the path itself, else `"PART is "`.
        link: String,
        target: String,
    },
    #[error("{flag} {path}: {part}not a folder but {kind}{under}")]
    NotAFolder {
        flag: &'static str,
        path: String,
        /// Empty when the path itself is not a folder, else `"PART is "`.
        part: String,
        kind: &'static str,
        /// Empty when the path itself is not a folder; else why that matters.
        under: &'static str,
    },
    #[error("{flag} {path}: a folder, where bench writes a file")]
    NotAFile { flag: &'static str, path: String },
    #[error("{flag} {path}: cannot write in {folder}: {source}")]
    Unwritable {
        flag: &'static str,
        path: String,
        folder: String,
        source: std::io::Error,
    },
    #[error("{flag} {path}: cannot read {part}: {source}")]
    Unreadable {
        flag: &'static str,
        path: String,
        part: String,
        source: std::io::Error,
    },
}

/// What a file type is, in the words of an output error.
fn kind_of_output(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "a file"
    } else {
        kind_of(ft)
    }
}

/// Checks that `path`, given with `flag`, can be the folder a command writes (or creates)
/// before the command does its work: the path, or the nearest of its ancestors that
/// exists, must be a folder (a link to one is followed; a dangling link is refused, since
/// creating through it fails with "File exists") in which this process can create a file
/// (tried with an unnamed temporary file, which leaves nothing behind; a permission check
/// would be wrong for root and for read-only mounts).
pub fn output_folder(flag: &'static str, path: &Path) -> Result<(), OutputError> {
    writable(flag, path, path)
}

/// Checks that `path`, given with `flag`, can be the file a command writes: not a folder,
/// and in a folder [`output_folder`] accepts (or one that can be created).
pub fn output_file(flag: &'static str, path: &Path) -> Result<(), OutputError> {
    if path.is_dir() {
        return Err(OutputError::NotAFile {
            flag,
            path: path.display().to_string(),
        });
    }
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => writable(flag, path, p),
        _ => writable(flag, path, Path::new(".")),
    }
}

/// The check of [`output_folder`] on `start`, reported as a fault of `shown`.
fn writable(flag: &'static str, shown: &Path, start: &Path) -> Result<(), OutputError> {
    let path = shown.display().to_string();
    let part = |p: &Path| {
        if p == shown {
            String::new()
        } else {
            format!("{} is ", p.display())
        }
    };
    // The nearest part of the path that exists, without following a link at its end. A
    // missing part, or a file above it ("not a directory"), sends the search upwards, where
    // the part at fault is found.
    let mut at = start.to_path_buf();
    let meta = loop {
        match std::fs::symlink_metadata(&at) {
            Ok(m) => break m,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(nix::libc::ENOTDIR) =>
            {
                at = match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => std::path::PathBuf::from("."),
                };
            }
            Err(source) => {
                return Err(OutputError::Unreadable {
                    flag,
                    path,
                    part: at.display().to_string(),
                    source,
                })
            }
        }
    };
    let meta = if meta.file_type().is_symlink() {
        match std::fs::metadata(&at) {
            Ok(m) => m,
            Err(_) => {
                return Err(OutputError::Dangling {
                    flag,
                    link: part(&at),
                    target: std::fs::read_link(&at)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default(),
                    path,
                })
            }
        }
    } else {
        meta
    };
    if !meta.is_dir() {
        let own = at == shown;
        return Err(OutputError::NotAFolder {
            flag,
            part: part(&at),
            kind: kind_of_output(meta.file_type()),
            under: if own {
                ""
            } else {
                ", so nothing can be made under it"
            },
            path,
        });
    }
    tempfile::tempfile_in(&at).map_err(|source| OutputError::Unwritable {
        flag,
        path,
        folder: at.display().to_string(),
        source,
    })?;
    Ok(())
}

/// The file in which a command that replaces its output folder whole (`bench site -o`,
/// `bench report merge -o`) lists, one relative path a line, every file and folder it
/// wrote there: a later run over the folder then knows which entries are its own to
/// replace and which a person or another tool put there (a `CNAME`, a note in `logs/`, a
/// store, run folders), and refuses rather than delete those.
pub const WRITTEN_LIST: &str = ".bench-written";

/// The largest [`WRITTEN_LIST`] read: a site of a hundred thousand pages lists a few MB.
const MAX_WRITTEN_LIST: u64 = 64 * MIB;

/// Every path under `dir`, relative to it, sorted: folders are walked, links are listed
/// and never followed.
fn walk(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![std::path::PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in std::fs::read_dir(dir.join(&rel))? {
            let e = e?;
            let path = rel.join(e.file_name());
            if e.file_type()?.is_dir() {
                todo.push(path.clone());
            }
            out.push(path.to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Writes [`WRITTEN_LIST`] into `dir`, naming every file and folder in it (the list
/// included): called last, when the command has written everything.
pub fn list_written(dir: &Path) -> std::io::Result<()> {
    let mut names = walk(dir)?;
    names.push(WRITTEN_LIST.to_string());
    names.sort();
    names.dedup();
    let mut text = names.join("\n");
    text.push('\n');
    std::fs::write(dir.join(WRITTEN_LIST), text)
}

/// The paths under `dir` (an earlier output of a command that replaces it whole) that its
/// [`WRITTEN_LIST`] does not name, sorted; `None` when it has no list that reads (none, a
/// folder or FIFO in its place, too large, not UTF-8): then nothing tells bench's files
/// from anyone else's.
pub fn unlisted_entries(dir: &Path) -> Option<Vec<String>> {
    // The list bench wrote is a plain file: a link in its place (to a list naming a
    // person's files) is no list, never followed.
    let path = dir.join(WRITTEN_LIST);
    if !std::fs::symlink_metadata(&path).ok()?.file_type().is_file() {
        return None;
    }
    let list = read_to_string_bounded(&path, MAX_WRITTEN_LIST).ok()?;
    let listed: std::collections::HashSet<&str> = list.lines().collect();
    let found = walk(dir).ok()?;
    Some(
        found
            .into_iter()
            .filter(|n| !listed.contains(n.as_str()))
            .collect(),
    )
}

/// `path` absolute, with the links of its existing part resolved, so that two spellings of
/// one place (`site/../site/x`, a link to it) compare equal.
pub fn resolved(path: &Path) -> std::path::PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return abs,
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out
}

/// Refuses an input (`flag` names it) that lies inside the output folder `out`, which the
/// command replaces whole: the store, the run folders or the baselines a command reads
/// would be deleted with the previous output (exit 2, naming both).
pub fn input_outside_output(flag: &str, input: &Path, out: &Path) -> Result<(), String> {
    // An input that is not there (the default `baselines` of a merge given none) has
    // nothing the replacement could delete.
    if std::fs::symlink_metadata(input).is_err() {
        return Ok(());
    }
    let (i, o) = (resolved(input), resolved(out));
    if i == o || i.starts_with(&o) {
        return Err(format!(
            "{flag} {} is inside -o {}, which is replaced whole: keep what the command reads outside its output folder",
            input.display(),
            out.display()
        ));
    }
    Ok(())
}

/// Refuses an earlier output `dir` (given with `-o` as `shown`) that holds entries its
/// [`WRITTEN_LIST`] does not name, or has no list that reads: `what` ("bench site")
/// replaces the folder whole and would delete them (exit 2, naming them). An empty folder
/// is fine.
pub fn only_listed_entries(dir: &Path, shown: &Path, what: &str) -> Result<(), String> {
    let empty = std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none());
    if empty {
        return Ok(());
    }
    match unlisted_entries(dir) {
        None => Err(format!(
            "-o {}: it holds no readable {WRITTEN_LIST}, the list of what {what} wrote there (an output of an older bench, or the list was removed or damaged), so its files cannot be told from anyone else's; {what} replaces its output folder whole: give a new or empty folder",
            shown.display()
        )),
        Some(foreign) if !foreign.is_empty() => {
            let names: Vec<String> = foreign
                .iter()
                .take(5)
                .map(|n| crate::sanitize::inline(n).into_owned())
                .collect();
            let more = if foreign.len() > 5 {
                format!(" and {} more", foreign.len() - 5)
            } else {
                String::new()
            };
            Err(format!(
                "-o {}: it holds {}{more}, which {what} did not write ({WRITTEN_LIST} lists what it wrote); {what} replaces its output folder whole, so move those out or give a new folder",
                shown.display(),
                names.join(", ")
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_path_that_cannot_be_written_says_which_part_is_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("file"), "x").unwrap();
        std::os::unix::fs::symlink(d.join("gone"), d.join("dangling")).unwrap();
        assert!(output_folder("-o", &d.join("new/deeper")).is_ok());
        assert!(output_folder("-o", d).is_ok());
        let e = output_folder("-o", &d.join("dangling")).unwrap_err();
        assert!(
            matches!(&e, OutputError::Dangling { link, .. } if link.is_empty()),
            "{e}"
        );
        let e = output_folder("-o", &d.join("dangling/run")).unwrap_err();
        assert!(
            e.to_string().contains("dangling is a symbolic link to "),
            "{e}"
        );
        let e = output_folder("-o", &d.join("file")).unwrap_err();
        assert!(
            e.to_string().ends_with("file: not a folder but a file"),
            "{e}"
        );
        let e = output_folder("-o", &d.join("file/run")).unwrap_err();
        assert!(
            e.to_string()
                .contains("file is not a folder but a file, so nothing"),
            "{e}"
        );
        let e = output_file("-o", d).unwrap_err();
        assert!(matches!(e, OutputError::NotAFile { .. }), "{e}");
        assert!(output_file("-o", &d.join("file")).is_ok());
        if Path::new("/proc/self").is_dir() {
            let e = output_folder("--results-dir", Path::new("/proc/bench-x")).unwrap_err();
            assert!(matches!(e, OutputError::Unwritable { .. }), "{e}");
        }
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = read_bounded(&fifo, MIB).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("FIFO"), "{e}");
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_bounded(&link, MIB).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        assert!(read_bounded(dir.path(), MIB)
            .unwrap_err()
            .to_string()
            .contains("directory"));
    }

    #[test]
    fn an_appending_writer_refuses_a_fifo_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("j");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = open_append_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let ok = dir.path().join("k");
        open_append_regular(&ok).unwrap();
        assert!(ok.is_file());
    }

    #[test]
    fn a_regular_file_is_read_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_to_string_bounded(&p, 5).unwrap(), "hello");
        let e = read_bounded(&p, 4).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        assert_eq!(
            read_bounded(&dir.path().join("missing"), 4)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_written_list_names_what_was_written_and_nothing_added_later() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        only_listed_entries(d, d, "bench site").expect("an empty folder is fine");
        std::fs::write(d.join("index.html"), "x").unwrap();
        assert_eq!(unlisted_entries(d), None, "no list: nothing can be told");
        assert!(only_listed_entries(d, d, "bench site").is_err());
        std::fs::create_dir(d.join("runs")).unwrap();
        std::fs::write(d.join("runs/r1.html"), "x").unwrap();
        list_written(d).unwrap();
        assert_eq!(unlisted_entries(d), Some(vec![]));
        std::fs::write(d.join("CNAME"), "x").unwrap();
        std::fs::write(d.join("a\nb"), "x").unwrap();
        std::fs::write(d.join("runs/precious.txt"), "x").unwrap();
        assert_eq!(
            unlisted_entries(d),
            Some(vec![
                "CNAME".to_string(),
                "a\nb".to_string(),
                "runs/precious.txt".to_string()
            ])
        );
        let m = only_listed_entries(d, d, "bench site").unwrap_err();
        assert!(
            m.contains("it holds CNAME, a\\nb, runs/precious.txt, which bench site"),
            "{m}"
        );
        // A list that is a link (to a list naming the user's files) is no list.
        let elsewhere = d.join("elsewhere");
        std::fs::write(&elsewhere, "CNAME\n").unwrap();
        std::fs::rename(d.join(WRITTEN_LIST), d.join("kept")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.join(WRITTEN_LIST)).unwrap();
        assert_eq!(unlisted_entries(d), None);
        std::fs::remove_file(d.join(WRITTEN_LIST)).unwrap();
        // A list that is not a file, or does not read as UTF-8, is no list.
        std::fs::write(d.join(WRITTEN_LIST), b"index.html\n\xff\xfe\n").unwrap();
        assert_eq!(unlisted_entries(d), None);
    }
}
