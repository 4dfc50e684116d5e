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

#[cfg(test)]
mod tests {
    use super::*;

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
}
