//! Atomic file writes: every document `bench` writes (results, baselines, reports) goes
//! through here so that a crash or Ctrl-C never leaves a half-written file behind.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The mode `open(2)` asks for when a plain write creates a file; the process's umask
/// takes its bits away, as it does for `std::fs::write`.
const PLAIN_MODE: u32 = 0o666;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory (so the
/// rename stays on one file system), flushed and synced, then renamed over `path`.
///
/// The file ends up with the mode a plain write would give it: a new file 0666 minus the
/// umask, an existing one keeps its own mode. The temporary file's private 0600, which
/// `tempfile` picks so that other accounts cannot read a scratch file, would otherwise
/// survive the rename, and on a shared CI runner nobody else could read the reports.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let existing = std::fs::metadata(path).ok().map(|m| m.permissions());
    // Created with 0666 the kernel applies the umask itself, exactly as for a plain
    // write; reading the umask would need umask(2), which changes it for every thread.
    let mut tmp = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(PLAIN_MODE))
        .tempfile_in(dir)?;
    if let Some(mode) = existing {
        tmp.as_file().set_permissions(mode)?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/x.json");
        super::write(&p, b"first version, longer").unwrap();
        super::write(&p, b"second").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        // No temporary files are left beside it.
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    /// A new file gets what `std::fs::write` gives under the same umask (whatever the
    /// test's umask is; tests/run_cli.rs runs the binary under 022 and 027), and a file
    /// that exists keeps its mode, as a plain write leaves it.
    #[test]
    fn modes_are_those_of_a_plain_write() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"x").unwrap();
        let ours = dir.path().join("ours");
        super::write(&ours, b"x").unwrap();
        assert_eq!(mode(&ours), mode(&plain));

        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o640)).unwrap();
        super::write(&ours, b"again").unwrap();
        assert_eq!(mode(&ours), 0o640);
    }
}
