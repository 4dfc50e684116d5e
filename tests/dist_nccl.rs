//! NCCL loaded at run time, on a machine without a GPU: `ncclGetVersion` and
//! `ncclGetUniqueId` work there, and the unique id travels through the rendezvous.
//!
//! The library is found as `bench` finds it: `$BENCH_NCCL_LIB`, else `libnccl.so.2` on
//! the loader path (`scripts/env.sh` puts the torch wheel's `nvidia/nccl/lib` on
//! `LD_LIBRARY_PATH`), else through the venv's Python (`$BENCH_PYTHON` or `python3`).
//! In CI (`CI` set) a missing library fails the tests; elsewhere they are skipped with a
//! message.

use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bench::dist::join_with_nccl;
use bench::dist::launch::free_port;
use bench::dist::nccl::{Nccl, UNIQUE_ID_BYTES};
use bench::dist::rendezvous::{Config, DistEnv, OnFailure};

fn python_nccl_path() -> Option<String> {
    let py = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(py)
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))",
        ])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && std::path::Path::new(&p).exists()).then_some(p)
}

fn nccl() -> Option<Arc<Nccl>> {
    let first = Nccl::load(None);
    let found = match first {
        Ok(n) => Some(n),
        Err(e) => match python_nccl_path() {
            Some(p) => Some(Nccl::load(Some(&p)).unwrap_or_else(|e2| panic!("{p}: {e2}"))),
            None => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI must have NCCL (the torch wheel's nvidia-nccl): {e}"
                );
                eprintln!("skipping: no NCCL here ({e})");
                None
            }
        },
    };
    found
}

#[test]
fn version_is_an_nccl_2_release() {
    let Some(n) = nccl() else { return };
    let v = n.version().unwrap();
    assert_eq!(v.major, 2, "{v} from {}", n.name());
    assert!(v.minor >= 12, "{v}");
}

#[test]
fn unique_ids_are_128_bytes_and_differ_between_calls() {
    let Some(n) = nccl() else { return };
    let a = n.unique_id().unwrap();
    let b = n.unique_id().unwrap();
    assert_eq!(a.as_bytes().len(), UNIQUE_ID_BYTES);
    assert!(a.as_bytes().iter().any(|&x| x != 0));
    assert_ne!(a.as_bytes(), b.as_bytes());
}

#[test]
fn the_unique_id_reaches_every_rank_through_the_rendezvous() {
    let Some(n) = nccl() else { return };
    let port = free_port().unwrap();
    let hs: Vec<_> = (0..4u32)
        .map(|rank| {
            let n = Arc::clone(&n);
            thread::spawn(move || {
                let env = DistEnv {
                    rank,
                    world_size: 4,
                    local_rank: rank,
                    local_world_size: 4,
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                };
                let cfg = Config {
                    join_timeout: Duration::from_secs(30),
                    on_failure: OnFailure::Record,
                    ..Config::default()
                };
                let (rv, id) = join_with_nccl(&env, &n, cfg).unwrap();
                rv.finish(Duration::from_secs(10)).unwrap();
                id.as_bytes().to_vec()
            })
        })
        .collect();
    let ids: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(ids
        .iter()
        .all(|i| i == &ids[0] && i.len() == UNIQUE_ID_BYTES));
}
