//! The named suspects of a changed cell: everything that differs between this run and the
//! cell's last good run: the commit range, the speed switches, the library, driver and
//! framework versions, the framework's config hash, the host and the GPU model. Pure.
//!
//! A verdict line then says what a reader would otherwise dig out by hand:
//! `regressed -3.0% (-7.1 sigma) since run X (commit abc1234); changed since:
//! BENCH_FUSED_ADAMW (unset) -> 0`.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::record::Versions;
use super::store::Point;

/// One thing that differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// What changed: a switch's name, `libtorch`, `driver`, `host`, `commit`, ...
    pub what: String,
    /// Its value in the last good run (`None`: unset or unknown).
    pub before: Option<String>,
    pub after: Option<String>,
}

impl Change {
    /// `NAME before -> after`, with `(unset)` for an absent value.
    pub(crate) fn render(&self) -> String {
        let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "(unset)".into());
        if self.what == "commit" {
            return format!("commits {}..{}", short(&self.before), short(&self.after));
        }
        format!("{} {} -> {}", self.what, v(&self.before), v(&self.after))
    }
}

fn short(c: &Option<String>) -> String {
    c.as_deref()
        .map(|c| c.chars().take(7).collect())
        .unwrap_or_else(|| "?".into())
}

/// What this run of a cell ran with (the same fields a [`Point`] has).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Identity {
    pub commit: Option<String>,
    pub host: String,
    pub switches: IndexMap<String, String>,
    pub versions: Versions,
    pub context: IndexMap<String, String>,
}

impl Identity {
    pub(crate) fn of_point(p: &Point) -> Identity {
        Identity {
            commit: p.commit.clone(),
            host: p.host.clone(),
            switches: p.switches.clone(),
            versions: p.versions.clone(),
            context: p.context.clone(),
        }
    }
}

/// What differs between `good` and `now`, the commit first, then the switches (the likely
/// cause when set), then versions, the framework's identity, the host and the GPU model.
pub(crate) fn changes(good: &Identity, now: &Identity) -> Vec<Change> {
    let mut out = Vec::new();
    let mut push = |what: &str, before: Option<&str>, after: Option<&str>| {
        if before != after {
            out.push(Change {
                what: what.to_string(),
                before: before.map(str::to_string),
                after: after.map(str::to_string),
            });
        }
    };
    push("commit", good.commit.as_deref(), now.commit.as_deref());
    let mut names: Vec<&String> = good.switches.keys().chain(now.switches.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        push(
            name,
            good.switches.get(name).map(String::as_str),
            now.switches.get(name).map(String::as_str),
        );
    }
    let (g, n) = (&good.versions, &now.versions);
    push("bench", Some(g.bench.as_str()), Some(n.bench.as_str()));
    for (what, a, b) in [
        ("libtorch", &g.libtorch, &n.libtorch),
        ("CUDA", &g.cuda, &n.cuda),
        ("ROCm", &g.rocm, &n.rocm),
        ("NCCL", &g.nccl, &n.nccl),
        ("driver", &g.driver, &n.driver),
    ] {
        push(what, a.as_deref(), b.as_deref());
    }
    let mut keys: Vec<&String> = good.context.keys().chain(now.context.keys()).collect();
    keys.dedup();
    let mut seen = Vec::new();
    for k in keys {
        if seen.contains(&k) {
            continue;
        }
        seen.push(k);
        push(
            k,
            good.context.get(k).map(String::as_str),
            now.context.get(k).map(String::as_str),
        );
    }
    push("host", Some(good.host.as_str()), Some(now.host.as_str()));
    push("GPU", g.gpu_model.as_deref(), n.gpu_model.as_deref());
    // An empty bench version (an imported run without one) is not a change.
    out.retain(|c| !(c.what == "bench" && c.before.as_deref() == Some("")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(commit: &str) -> Identity {
        Identity {
            commit: Some(commit.into()),
            host: "gpu-01".into(),
            versions: Versions {
                bench: "0.1.0".into(),
                libtorch: Some("2.11.0".into()),
                driver: Some("580.159.04".into()),
                ..Versions::default()
            },
            ..Identity::default()
        }
    }

    #[test]
    fn a_switch_set_since_the_last_good_run_is_named() {
        let good = id("abcdef0123");
        let mut now = id("abcdef0123");
        now.switches.insert("BENCH_FUSED_ADAMW".into(), "0".into());
        let c = changes(&good, &now);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].render(), "BENCH_FUSED_ADAMW (unset) -> 0");
    }

    #[test]
    fn commits_versions_framework_and_host_are_listed_in_order() {
        let mut good = id("1111111aaaa");
        good.context.insert("framework config".into(), "aaa".into());
        let mut now = id("2222222bbbb");
        now.versions.driver = Some("590.1".into());
        now.host = "gpu-02".into();
        now.context.insert("framework config".into(), "bbb".into());
        let c: Vec<String> = changes(&good, &now).iter().map(Change::render).collect();
        assert_eq!(
            c,
            [
                "commits 1111111..2222222",
                "driver 580.159.04 -> 590.1",
                "framework config aaa -> bbb",
                "host gpu-01 -> gpu-02"
            ]
        );
        assert!(changes(&good, &good).is_empty());
    }
}
