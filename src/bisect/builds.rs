//! The builds kept per commit: the file a setup built at a commit (`triage.worker`,
//! `--worker-exe`) is copied into a cache once the setup succeeds, so that a later job
//! that needs the same commit (the next night's side-by-side pairs against the same last
//! good commit, a bisection resumed by the next job, its ends already measured) runs that
//! build instead of building the commit again.
//!
//! What is kept and where:
//! - Only a named build product is kept. A setup whose effect is not one file (`pip
//!   install -e .` of a command workload) runs again at each job; its worktree's ignored
//!   files still make it incremental within one.
//! - A build is keyed by the commit, the setup command and the product's path: another
//!   recipe for the same commit builds anew.
//! - The cache lives in the repository's git directory (`.git/bench-builds/`), which a CI
//!   checkout keeps between jobs (`actions/checkout` and GitLab clean the work tree, not
//!   `.git`), and which another clone of the repository does not share. `BENCH_BUILD_CACHE`
//!   names another folder, or `off` keeps nothing.
//! - The [`KEEP`] builds used last are kept; older ones are removed when a build is added.
//! - An entry is written under a temporary name and renamed into place, so a job killed
//!   while copying leaves no half-copied build for the next job to run.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// How many builds are kept (the most recently used). A nightly needs its last good
/// commit's build, and a bisection's few probed commits; a built bench is tens of MB.
pub(crate) const KEEP: usize = 8;

/// The environment variable naming the cache's folder, or `off`.
pub(crate) const ENV: &str = "BENCH_BUILD_CACHE";

/// The name the build product is kept under in its entry's folder.
const PRODUCT: &str = "build";

/// A folder of builds, one sub-folder per (commit, setup, product).
#[derive(Debug, Clone)]
pub(crate) struct BuildCache {
    dir: PathBuf,
}

impl BuildCache {
    /// The cache of the repository whose git directory is `common_dir`, or the folder
    /// `BENCH_BUILD_CACHE` names; `None` when that says `off`.
    pub(crate) fn for_repo(common_dir: &Path) -> Option<BuildCache> {
        match std::env::var_os(ENV) {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(BuildCache {
                dir: PathBuf::from(v),
            }),
            _ => Some(BuildCache {
                dir: common_dir.join("bench-builds"),
            }),
        }
    }

    /// The key of a build: its commit, its setup command and its product's path, hashed
    /// (the setup is free text, not a file name).
    pub(crate) fn key(commit: &str, setup: &str, product: &Path) -> String {
        let d = Sha256::digest(format!("{commit}\0{setup}\0{}", product.display()).as_bytes());
        let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}-{hex}", &commit[..commit.len().min(12)])
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The kept build of `key`, marked as used now; `None` when there is none.
    pub(crate) fn lookup(&self, key: &str) -> Option<PathBuf> {
        let product = self.entry(key).join(PRODUCT);
        if !product.is_file() {
            return None;
        }
        // The entry's time is its last use, which the eviction orders by.
        let now = std::fs::File::open(self.entry(key))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        if let Err(e) = now {
            eprintln!(
                "warning: build cache {}: cannot mark {key} as used: {e}",
                self.dir.display()
            );
        }
        Some(product)
    }

    /// Keeps a copy of `product` (an executable built at the commit of `key`), then
    /// removes the builds used longest ago beyond [`KEEP`]. Returns where the copy is.
    pub(crate) fn keep(&self, key: &str, product: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let staging = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempdir_in(&self.dir)?;
        let copy = staging.path().join(PRODUCT);
        std::fs::copy(product, &copy)?;
        // The permissions travel with `fs::copy`; the copy must reach the disk before the
        // rename makes it visible to the next job.
        std::fs::File::open(&copy)?.sync_all()?;
        let entry = self.entry(key);
        if entry.exists() {
            std::fs::remove_dir_all(&entry)?;
        }
        std::fs::rename(staging.keep(), &entry)?;
        self.evict()?;
        Ok(entry.join(PRODUCT))
    }

    /// Removes the entries used longest ago until [`KEEP`] are left; leftovers of a job
    /// killed while copying (`.incoming-*`) older than an hour go too.
    fn evict(&self) -> std::io::Result<()> {
        let mut entries = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let used = e.metadata()?.modified()?;
            if name.starts_with(".incoming-") {
                let age = used.elapsed().unwrap_or_default();
                if age > std::time::Duration::from_secs(3600) {
                    std::fs::remove_dir_all(e.path())?;
                }
                continue;
            }
            entries.push((used, e.path()));
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (_, old) in entries.into_iter().skip(KEEP) {
            std::fs::remove_dir_all(old)?;
        }
        Ok(())
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("worker");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_kept_build_is_found_by_its_commit_setup_and_product() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BuildCache {
            dir: tmp.path().join("cache"),
        };
        let key = BuildCache::key("a".repeat(40).as_str(), "make", Path::new("w"));
        assert!(cache.lookup(&key).is_none());
        let kept = cache.keep(&key, &product(tmp.path(), "v1")).unwrap();
        assert_eq!(cache.lookup(&key), Some(kept.clone()));
        assert_eq!(std::fs::read_to_string(kept).unwrap(), "v1");
        // Another setup or product of the same commit is another build.
        assert_ne!(
            key,
            BuildCache::key("a".repeat(40).as_str(), "make -j", Path::new("w"))
        );
        assert_ne!(
            key,
            BuildCache::key("a".repeat(40).as_str(), "make", Path::new("v"))
        );
    }

    #[test]
    fn only_the_builds_used_last_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BuildCache {
            dir: tmp.path().join("cache"),
        };
        let src = product(tmp.path(), "x");
        let keys: Vec<String> = (0..KEEP + 2)
            .map(|i| BuildCache::key(&format!("{i:040}"), "make", Path::new("w")))
            .collect();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(1000);
        for (i, k) in keys.iter().take(KEEP).enumerate() {
            cache.keep(k, &src).unwrap();
            // Each entry used a second after the one before (file times are coarse).
            let t = old + std::time::Duration::from_secs(i as u64);
            std::fs::File::open(cache.entry(k))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // The first build is used again: it is kept when two more come, the second and
        // third go.
        cache.lookup(&keys[0]).unwrap();
        cache.keep(&keys[KEEP], &src).unwrap();
        cache.keep(&keys[KEEP + 1], &src).unwrap();
        assert!(cache.lookup(&keys[0]).is_some());
        assert!(cache.lookup(&keys[1]).is_none());
        assert!(cache.lookup(&keys[2]).is_none());
        assert!(cache.lookup(&keys[3]).is_some());
        let left = std::fs::read_dir(&cache.dir).unwrap().count();
        assert_eq!(left, KEEP);
    }
}
