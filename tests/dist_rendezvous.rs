//! The rendezvous on CPU: ranks as threads and as real processes (this test binary
//! re-run in a child role, with the environment the runner's launch plan gives each rank).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use bench::cell::{Cell, CellId, Params, Value};
use bench::dist::launch::free_port;
use bench::dist::rendezvous::{join, Config, DistEnv, OnFailure, RendezvousError};
use bench::events::{ErrorKind, Event};
use bench::run::launch::{self, AttemptCtx};
use indexmap::IndexMap;

fn env(rank: u32, world: u32, port: u16) -> DistEnv {
    DistEnv {
        rank,
        world_size: world,
        local_rank: rank,
        local_world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    }
}

fn cfg(join_s: f64) -> Config {
    Config {
        join_timeout: Duration::from_secs_f64(join_s),
        heartbeat: Duration::from_millis(200),
        peer_timeout: Duration::from_secs(30),
        on_failure: OnFailure::Record,
    }
}

fn blob() -> Result<Vec<u8>, String> {
    Ok((0..128u32)
        .map(|i| (i * 7 + std::process::id()) as u8)
        .collect())
}

#[test]
fn four_ranks_in_threads_exchange_the_blob_and_pass_barriers() {
    let port = free_port().unwrap();
    // Start the other ranks before rank 0 so they must retry their connection.
    let handles: Vec<_> = [3u32, 2, 1, 0]
        .into_iter()
        .map(|r| {
            thread::spawn(move || {
                if r == 0 {
                    thread::sleep(Duration::from_millis(300));
                }
                let (rv, b) = join(&env(r, 4, port), cfg(20.0), blob)?;
                rv.barrier(Duration::from_secs(10))?;
                rv.barrier(Duration::from_secs(10))?;
                rv.finish(Duration::from_secs(10))?;
                Ok::<_, RendezvousError>((r, b))
            })
        })
        .collect();
    let mut got: Vec<(u32, Vec<u8>)> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    got.sort();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].1, blob().unwrap());
    assert!(got.iter().all(|(_, b)| *b == got[0].1));
}

#[test]
fn a_missing_rank_times_out_with_a_clear_error() {
    let port = free_port().unwrap();
    let r1 = thread::spawn(move || join(&env(1, 3, port), cfg(1.5), blob).map(|_| ()));
    let e0 = join(&env(0, 3, port), cfg(1.5), blob).unwrap_err();
    let msg = e0.to_string();
    assert!(
        matches!(&e0, RendezvousError::MissingRanks { missing, .. } if missing == &[2]),
        "{msg}"
    );
    assert!(msg.contains("rank(s) [2] of 3 did not join"), "{msg}");
    let e1 = r1.join().unwrap().unwrap_err();
    assert!(
        e1.to_string().contains("[2]"),
        "rank 1 should learn which rank is missing: {e1}"
    );
    assert_eq!(e1.exit_code(), bench::exit::worker::DISTRIBUTED);
}

#[test]
fn a_rank_without_rank_zero_gives_up_naming_the_address() {
    let port = free_port().unwrap();
    let e = join(&env(1, 2, port), cfg(0.5), blob).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RendezvousError::Unreachable { .. }), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
}

#[test]
fn a_rank_that_vanishes_or_reports_failure_is_noticed_by_all() {
    // Vanishing: rank 2 drops its handle without finishing (its sockets close as if its
    // process had died).
    let port = free_port().unwrap();
    let hs: Vec<_> = (0..3u32)
        .map(|r| thread::spawn(move || join(&env(r, 3, port), cfg(20.0), blob).unwrap().0))
        .collect();
    let mut rv: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    drop(rv.pop());
    for r in &rv {
        let f = r
            .wait_for_failure(Duration::from_secs(20))
            .expect("failure noticed");
        assert_eq!(f.rank, Some(2), "{f}");
        assert!(r.barrier(Duration::from_secs(5)).is_err());
    }

    // Reporting: rank 1 fails with a message the others receive.
    let port = free_port().unwrap();
    let hs: Vec<_> = (0..3u32)
        .map(|r| thread::spawn(move || join(&env(r, 3, port), cfg(20.0), blob).unwrap().0))
        .collect();
    let rv: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    rv[1].report_failure("CUDA out of memory");
    for r in [&rv[0], &rv[2]] {
        let f = r
            .wait_for_failure(Duration::from_secs(20))
            .expect("failure noticed");
        assert_eq!(f.rank, Some(1));
        assert_eq!(f.message, "CUDA out of memory");
    }
}

// ---- ranks as processes ------------------------------------------------------------

const CHILD: &str = "BENCH_RDZV_CHILD";

/// The child role: a no-op unless started by the tests below with `BENCH_RDZV_CHILD`.
/// Joins with the default (exit) failure policy, prints the blob, passes a barrier, then
/// either finishes (`ok`) or hangs as if stuck in a collective (`hang`).
#[test]
fn rendezvous_child_role() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let e = DistEnv::from_env().unwrap().expect("contract set");
    let config = Config {
        join_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    let (rv, b) = match join(&e, config, blob) {
        Ok(x) => x,
        Err(err) => {
            println!("join-error: {err}");
            std::process::exit(err.exit_code());
        }
    };
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    // A leading newline: libtest prints "test ... " without one before our output.
    println!("\njoined rank={} blob={hex}", e.rank);
    rv.barrier(Duration::from_secs(30)).unwrap();
    println!("ready rank={}", e.rank);
    if mode == "hang" {
        thread::sleep(Duration::from_secs(120));
    }
    rv.finish(Duration::from_secs(30)).unwrap();
}

struct Ranks {
    children: Vec<Child>,
    lines: mpsc::Receiver<(u32, String)>,
    out: BTreeMap<u32, Vec<String>>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Ranks {
    /// `world` ranks of this test binary in the child role, each with the environment the
    /// runner's launch plan gives a rank of a built-in `ddp` cell of `world` GPUs.
    fn spawn(world: i64, mode: &str) -> Ranks {
        let mut values = IndexMap::new();
        values.insert("gpus".to_string(), Value::Int(world));
        values.insert("parallel".to_string(), Value::Str("ddp".into()));
        let cell = Cell {
            id: CellId::from_values(&values),
            values,
            params: Params::default(),
        };
        let exe = std::env::current_exe().unwrap();
        let ctx = AttemptCtx {
            master_port: free_port().unwrap(),
            ..AttemptCtx::default()
        };
        let plan = launch::plan(&cell, &ctx, &exe).unwrap();
        assert_eq!(plan.procs.len(), world as usize);
        let argv = [
            "rendezvous_child_role",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ];
        let (tx, rx) = mpsc::channel();
        let children = plan
            .procs
            .iter()
            .map(|s| {
                let mut child = Command::new(&exe)
                    .args(argv)
                    .envs(s.env.iter().map(|(k, v)| (k, v)))
                    .env(CHILD, mode)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let stdout = child.stdout.take().unwrap();
                let (tx, rank) = (tx.clone(), s.rank);
                thread::spawn(move || {
                    for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                        let _ = tx.send((rank, l));
                    }
                });
                child
            })
            .collect();
        Ranks {
            children,
            lines: rx,
            out: BTreeMap::new(),
        }
    }

    /// Collects output until `n` lines starting with `prefix` have been seen.
    fn wait_lines(&mut self, prefix: &str, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let seen = self
                .out
                .values()
                .flatten()
                .filter(|l| l.starts_with(prefix))
                .count();
            if seen >= n {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((r, l)) => self.out.entry(r).or_default().push(l),
                Err(_) => panic!("only {seen} of {n} `{prefix}` lines; output {:?}", self.out),
            }
        }
    }

    /// Waits for `rank` to exit, up to `limit`; its exit code.
    fn wait_exit(&mut self, rank: usize, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.children[rank].try_wait().unwrap() {
                while let Ok((r, l)) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.out.entry(r).or_default().push(l);
                }
                return s.code();
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank} still running after {limit:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn four_rank_processes_share_one_blob_and_exit_cleanly() {
    let mut ranks = Ranks::spawn(4, "ok");
    for r in 0..4 {
        assert_eq!(
            ranks.wait_exit(r, Duration::from_secs(60)),
            Some(0),
            "{:?}",
            ranks.out
        );
    }
    let blobs: Vec<&str> = ranks
        .out
        .values()
        .flatten()
        .filter_map(|l| l.strip_prefix("joined rank="))
        .filter_map(|l| l.split_once(" blob=").map(|(_, b)| b))
        .collect();
    assert_eq!(blobs.len(), 4, "{:?}", ranks.out);
    assert!(blobs.iter().all(|b| b == &blobs[0] && b.len() == 256));
}

fn assert_distributed_exit(ranks: &mut Ranks, survivors: &[usize], killed: u32) {
    for &r in survivors {
        let code = ranks.wait_exit(r, Duration::from_secs(30));
        assert_eq!(
            code,
            Some(bench::exit::worker::DISTRIBUTED),
            "rank {r}: {:?}",
            ranks.out
        );
        let err = ranks.out[&(r as u32)]
            .iter()
            .find_map(|l| Event::parse_line(l))
            .expect("an error event");
        match err {
            Event::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Distributed);
                assert!(message.contains(&format!("rank {killed}")), "{message}");
            }
            other => panic!("expected an error event, got {other:?}"),
        }
    }
}

#[test]
fn killing_one_rank_process_makes_the_others_exit_with_the_distributed_code() {
    let mut ranks = Ranks::spawn(3, "hang");
    ranks.wait_lines("ready", 3, Duration::from_secs(60));
    ranks.children[2].kill().unwrap();
    assert_distributed_exit(&mut ranks, &[0, 1], 2);
}

#[test]
fn killing_rank_zero_makes_the_others_exit_with_the_distributed_code() {
    let mut ranks = Ranks::spawn(3, "hang");
    ranks.wait_lines("ready", 3, Duration::from_secs(60));
    ranks.children[0].kill().unwrap();
    assert_distributed_exit(&mut ranks, &[1, 2], 0);
}
