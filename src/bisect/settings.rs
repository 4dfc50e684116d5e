//! The resolved settings of `bench bisect`, apart from the command that runs them: the
//! probes read them as much as the command does, and the command uses the probes, so they
//! live in a file both import.

use std::path::PathBuf;

use crate::format::Format;

/// Resolved settings of `bench bisect`.
#[derive(Debug, Clone)]
pub(crate) struct BisectSettings {
    /// The cell id.
    pub cell: String,
    /// A revision where the cell is as it should be.
    pub good: String,
    /// A later revision where it has changed.
    pub bad: String,
    /// The matrix file, relative to the repository's root (read at each probed commit).
    pub matrix: PathBuf,
    /// Run through `sh -c` in the worktree before measuring a commit (install, build).
    pub setup: Option<String>,
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: String,
    /// The most repeats (samples) of one commit before it is called undecidable.
    pub max_repeats: usize,
    /// The executable that runs built-in cells, relative to the worktree (the commit's
    /// own build); `None`: this bench.
    pub worker_exe: Option<PathBuf>,
    /// Where probe run folders and logs go; `None`: `bench-bisect` in the repository's
    /// git directory.
    pub work_dir: Option<PathBuf>,
    pub format: Format,
}

/// The default of `--max-repeats`: a 1% shift with the nightly's noise (about 0.3% on an
/// H100) is told apart or called the same well within it, and a commit that is still
/// unknown after it is more likely noisy (a throttled host) than close.
pub(crate) const DEFAULT_MAX_REPEATS: usize = 20;
