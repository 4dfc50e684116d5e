//! Atomic file writes: every document `bench` writes (results, baselines, reports) goes
//! through here so that a crash or Ctrl-C never leaves a half-written file behind.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory (so the
/// rename stays on one file system), flushed and synced, then renamed over `path`.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
