//! The Slurm settings of a run: the matrix's `slurm:` block merged with the environment and
//! the flags, each name checked. The job script reads them, so they live apart from the
//! facade in `mod.rs` that imports the script.

use super::error::SlurmError;
use crate::matrix::spec::SlurmSpec;

/// Environment variable overriding the matrix's partition (a flag overrides both).
pub(crate) const ENV_PARTITION: &str = "BENCH_SLURM_PARTITION";
/// Environment variable overriding the matrix's account (a flag overrides both).
pub(crate) const ENV_ACCOUNT: &str = "BENCH_SLURM_ACCOUNT";
/// GPUs per node when neither the matrix nor anything else says (H100/H200/MI300X nodes).
pub(crate) const DEFAULT_GPUS_PER_NODE: u32 = 8;

/// Resolved Slurm settings for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Job time limit; `None` takes each cell's timeout plus a minute.
    pub time_s: Option<u64>,
    pub gpus_per_node: u32,
    /// Extra sbatch options, passed as separate arguments (never through a shell).
    pub sbatch_args: Vec<String>,
}

fn check_name(origin: &str, what: &'static str, v: String) -> Result<String, SlurmError> {
    let ok = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.,+-".contains(c));
    if ok {
        Ok(v)
    } else {
        Err(SlurmError::BadName {
            origin: origin.to_string(),
            what,
            value: v,
        })
    }
}

impl Settings {
    /// Merges, highest first: the flags (`--partition`, `--account`), the environment
    /// (`BENCH_SLURM_PARTITION`, `BENCH_SLURM_ACCOUNT`), the matrix's `slurm:` block.
    /// `env` reads a variable (pass `|k| std::env::var(k).ok()`).
    pub(crate) fn resolve(
        spec: Option<&SlurmSpec>,
        flag_partition: Option<&str>,
        flag_account: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SlurmError> {
        let pick = |flag: Option<&str>,
                    var: &'static str,
                    from_spec: Option<&String>,
                    what: &'static str,
                    key: &str|
         -> Result<Option<String>, SlurmError> {
            if let Some(f) = flag {
                return check_name(&format!("--{what}"), what, f.to_string()).map(Some);
            }
            if let Some(e) = env(var).filter(|e| !e.is_empty()) {
                return check_name(&format!("${var}"), what, e).map(Some);
            }
            from_spec
                .map(|s| check_name(&format!("matrix {key}"), what, s.clone()))
                .transpose()
        };
        let partition = pick(
            flag_partition,
            ENV_PARTITION,
            spec.and_then(|s| s.partition.as_ref()),
            "partition",
            "slurm.partition",
        )?;
        let account = pick(
            flag_account,
            ENV_ACCOUNT,
            spec.and_then(|s| s.account.as_ref()),
            "account",
            "slurm.account",
        )?;
        let time_s = spec
            .and_then(|s| s.time.as_ref())
            .map(|t| t.seconds().map_err(SlurmError::BadTime))
            .transpose()?;
        let gpus_per_node = spec
            .and_then(|s| s.gpus_per_node)
            .unwrap_or(DEFAULT_GPUS_PER_NODE);
        if gpus_per_node == 0 {
            return Err(SlurmError::ZeroGpusPerNode);
        }
        Ok(Settings {
            partition,
            account,
            time_s,
            gpus_per_node,
            sbatch_args: spec.map(|s| s.sbatch_args.clone()).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::spec::DurationSpec;

    fn spec() -> SlurmSpec {
        SlurmSpec {
            partition: Some("batch".into()),
            account: Some("proj1".into()),
            time: Some(DurationSpec::Text("1h30m".into())),
            gpus_per_node: Some(4),
            sbatch_args: vec!["--exclusive".into()],
        }
    }

    #[test]
    fn flags_beat_env_beat_matrix() {
        let none = |_: &str| None;
        let s = Settings::resolve(Some(&spec()), None, None, none).unwrap();
        assert_eq!(s.partition.as_deref(), Some("batch"));
        assert_eq!(s.account.as_deref(), Some("proj1"));
        assert_eq!(s.time_s, Some(5400));
        assert_eq!(s.gpus_per_node, 4);
        let env = |k: &str| (k == ENV_PARTITION).then(|| "h200".to_string());
        let s = Settings::resolve(Some(&spec()), None, None, env).unwrap();
        assert_eq!(s.partition.as_deref(), Some("h200"));
        let s = Settings::resolve(Some(&spec()), Some("debug"), Some("acct"), env).unwrap();
        assert_eq!(s.partition.as_deref(), Some("debug"));
        assert_eq!(s.account.as_deref(), Some("acct"));
        let s = Settings::resolve(None, None, None, none).unwrap();
        assert_eq!(
            (s.partition, s.gpus_per_node),
            (None, DEFAULT_GPUS_PER_NODE)
        );
    }

    #[test]
    fn bad_values_name_where_they_came_from() {
        let env = |k: &str| (k == ENV_ACCOUNT).then(|| "a b".to_string());
        let e = Settings::resolve(None, None, None, env).unwrap_err();
        assert!(e.to_string().contains("$BENCH_SLURM_ACCOUNT"), "{e}");
        assert!(e.is_bad_input());
        let mut s = spec();
        s.time = Some(DurationSpec::Text("soon".into()));
        let e = Settings::resolve(Some(&s), None, None, |_| None).unwrap_err();
        assert!(e.to_string().contains("slurm.time"), "{e}");
        let e = Settings::resolve(Some(&spec()), Some("x\ny"), None, |_| None).unwrap_err();
        assert!(e.to_string().contains("--partition"), "{e}");
    }
}
