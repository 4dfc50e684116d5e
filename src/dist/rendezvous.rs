//! Rendezvous of the ranks of one cell, on torchrun's environment contract.
//!
//! Every rank reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`
//! and `MASTER_PORT` ([`DistEnv`]). Rank 0 makes an opaque blob (the 128-byte NCCL unique
//! id; any bytes, so this is testable without NCCL), listens on `MASTER_PORT`, waits until
//! every other rank has connected and said hello, and sends each the blob. The connections
//! then stay open for the life of the run as a control channel:
//!
//! * [`Rendezvous::barrier`]: all ranks ready (rank 0 counts arrivals and releases);
//! * failure: a rank that reports an error ([`Rendezvous::report_failure`]), whose process
//!   dies (its socket closes), or that stops sending heartbeats is announced by rank 0 to
//!   every other rank; the loss of rank 0 is noticed by all. With [`OnFailure::Exit`] (the
//!   default for workers) a watcher thread prints an `error` event of kind `distributed`
//!   and exits the process with `exit::worker::DISTRIBUTED`, so no rank stays stuck in a
//!   collective waiting for a peer that is gone.
//!
//! Every wait has a deadline; nothing here can hang.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::events::{ErrorKind, Event};

/// The variables of the launch contract, as torchrun sets them.
pub const ENV_VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Protocol magic and version, sent in every hello so a stray connection is refused.
const MAGIC: &[u8; 8] = b"BENCHRV1";
/// Largest message accepted (the blob is 128 bytes; failure texts are short).
const MAX_MSG: u32 = 1 << 20;

/// Where this rank stands in the world, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
}

impl DistEnv {
    /// Reads the contract from the process environment; `Ok(None)` when neither `RANK`
    /// nor `WORLD_SIZE` is set (a plain single-process run).
    pub fn from_env() -> Result<Option<DistEnv>, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`DistEnv::from_env`], reading variables through `get` (for tests). `LOCAL_RANK`
    /// defaults to `RANK` and `LOCAL_WORLD_SIZE` to `WORLD_SIZE` (one host);
    /// `MASTER_ADDR` defaults to 127.0.0.1 when the world has one rank.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<DistEnv>, RendezvousError> {
        if get("RANK").is_none() && get("WORLD_SIZE").is_none() {
            return Ok(None);
        }
        let num = |var: &'static str, default: Option<u32>| -> Result<u32, RendezvousError> {
            match get(var) {
                Some(v) => v.trim().parse::<u32>().map_err(|e| RendezvousError::Env {
                    var,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
                None => default.ok_or(RendezvousError::Env {
                    var,
                    value: String::new(),
                    reason: "not set".into(),
                }),
            }
        };
        let rank = num("RANK", None)?;
        let world_size = num("WORLD_SIZE", None)?;
        let local_rank = num("LOCAL_RANK", Some(rank))?;
        let local_world_size = num("LOCAL_WORLD_SIZE", Some(world_size))?;
        if world_size == 0 || rank >= world_size {
            return Err(RendezvousError::Env {
                var: "RANK",
                value: rank.to_string(),
                reason: format!("must be below WORLD_SIZE={world_size}"),
            });
        }
        if local_world_size == 0 || local_rank >= local_world_size {
            return Err(RendezvousError::Env {
                var: "LOCAL_RANK",
                value: local_rank.to_string(),
                reason: format!("must be below LOCAL_WORLD_SIZE={local_world_size}"),
            });
        }
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.trim().is_empty() => a.trim().to_string(),
            _ if world_size == 1 => "127.0.0.1".to_string(),
            _ => {
                return Err(RendezvousError::Env {
                    var: "MASTER_ADDR",
                    value: String::new(),
                    reason: "not set".into(),
                })
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => p.trim().parse::<u16>().map_err(|e| RendezvousError::Env {
                var: "MASTER_PORT",
                value: p.clone(),
                reason: e.to_string(),
            })?,
            None if world_size == 1 => 0,
            None => {
                return Err(RendezvousError::Env {
                    var: "MASTER_PORT",
                    value: String::new(),
                    reason: "not set".into(),
                })
            }
        };
        Ok(Some(DistEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }))
    }

    /// The contract as `(name, value)` pairs, for a child's environment.
    pub fn to_env(&self) -> Vec<(String, String)> {
        let v = [
            self.rank.to_string(),
            self.world_size.to_string(),
            self.local_rank.to_string(),
            self.local_world_size.to_string(),
            self.master_addr.clone(),
            self.master_port.to_string(),
        ];
        ENV_VARS
            .iter()
            .zip(v)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// A rank that failed, as the other ranks learn it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    /// The failed rank, when known.
    pub rank: Option<u32>,
    pub message: String,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rank {
            Some(r) => write!(f, "rank {r} failed: {}", self.message),
            None => write!(f, "a rank failed: {}", self.message),
        }
    }
}

/// Failures of the rendezvous. All of them are distributed failures of the cell
/// ([`RendezvousError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("rank 0 cannot listen on port {port} (MASTER_PORT): {source}")]
    Bind { port: u16, source: io::Error },
    #[error("rendezvous on {endpoint}: rank(s) {missing:?} of {world_size} did not join within {waited_s:.1}s")]
    MissingRanks {
        endpoint: String,
        missing: Vec<u32>,
        world_size: u32,
        waited_s: f64,
    },
    #[error("rank {rank}: cannot reach rank 0 at {endpoint} (MASTER_ADDR:MASTER_PORT) within {waited_s:.1}s; last error: {last_error}")]
    Unreachable {
        rank: u32,
        endpoint: String,
        waited_s: f64,
        last_error: String,
    },
    #[error("rendezvous on {endpoint}: {detail}")]
    Protocol { endpoint: String, detail: String },
    #[error("{0}")]
    PeerFailed(RankFailure),
    #[error("rank {rank}: {what} timed out after {waited_s:.1}s")]
    Timeout {
        rank: u32,
        what: &'static str,
        waited_s: f64,
    },
    #[error("rank 0 could not make the rendezvous id: {0}")]
    Blob(String),
}

impl RendezvousError {
    /// The worker exit code for this failure: always `exit::worker::DISTRIBUTED`.
    pub fn exit_code(&self) -> i32 {
        crate::exit::worker::DISTRIBUTED
    }
}

/// What a rank does when it learns that another rank failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Run the failure hook, print an `error` event (kind `distributed`) on stdout and
    /// exit the process with `exit::worker::DISTRIBUTED`. Right for workers: the main
    /// thread may be blocked in a collective that will never complete.
    #[default]
    Exit,
    /// Only record it: [`Rendezvous::failure`] and [`Rendezvous::wait_for_failure`]
    /// report it, and barriers fail. For tests and callers that poll.
    Record,
}

/// Timeouts and policy of a rendezvous.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long all ranks have to join (connect, hello, receive the blob).
    pub join_timeout: Duration,
    /// How often each side sends a heartbeat on the control channel.
    pub heartbeat: Duration,
    /// A peer silent for this long is taken as failed (a hung host or a cut network,
    /// which close no socket).
    pub peer_timeout: Duration,
    pub on_failure: OnFailure,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            join_timeout: Duration::from_secs(300),
            heartbeat: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(60),
            on_failure: OnFailure::Exit,
        }
    }
}

/// Environment variable overriding [`Config::join_timeout`] in seconds (workers read it
/// through [`Config::from_env`]).
pub const ENV_JOIN_TIMEOUT: &str = "BENCH_RDZV_TIMEOUT_S";

impl Config {
    /// The defaults, with the join timeout from `$BENCH_RDZV_TIMEOUT_S` when set.
    pub fn from_env() -> Result<Config, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, RendezvousError> {
        let mut c = Config::default();
        if let Some(v) = get(ENV_JOIN_TIMEOUT) {
            let s: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| RendezvousError::Env {
                    var: ENV_JOIN_TIMEOUT,
                    value: v.clone(),
                    reason: "must be a positive number of seconds".into(),
                })?;
            c.join_timeout = Duration::from_secs_f64(s);
        }
        Ok(c)
    }
}

/// Called once, before the process exits, when [`OnFailure::Exit`] fires; e.g. to
/// `ncclCommAbort` so the GPU work is torn down cleanly.
pub type FailureHook = Box<dyn Fn(&RankFailure) + Send + Sync>;

// Message tags on the wire: tag (1 byte), payload length (u32 big-endian), payload.
const T_HELLO: u8 = 1;
const T_BLOB: u8 = 2;
const T_BARRIER: u8 = 3;
const T_RELEASE: u8 = 4;
const T_FAILED: u8 = 5;
const T_DONE: u8 = 6;
const T_HEARTBEAT: u8 = 7;

fn write_msg(s: &mut TcpStream, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(tag);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
    s.write_all(&buf)?;
    s.flush()
}

fn read_msg(s: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_MSG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message of {len} bytes is too large"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

fn failed_payload(f: &RankFailure) -> Vec<u8> {
    let mut p = f
        .rank
        .map(|r| r as i64)
        .unwrap_or(-1)
        .to_be_bytes()
        .to_vec();
    p.extend_from_slice(f.message.as_bytes());
    p
}

fn parse_failed(p: &[u8]) -> RankFailure {
    if p.len() < 8 {
        return RankFailure {
            rank: None,
            message: "malformed failure message".into(),
        };
    }
    let mut r = [0u8; 8];
    r.copy_from_slice(&p[..8]);
    let r = i64::from_be_bytes(r);
    RankFailure {
        rank: u32::try_from(r).ok(),
        message: String::from_utf8_lossy(&p[8..]).into_owned(),
    }
}

fn u64_payload(p: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(p).ok().map(u64::from_be_bytes)
}

#[derive(Default)]
struct State {
    failure: Option<RankFailure>,
    /// Rank 0: which ranks arrived at each barrier.
    arrivals: HashMap<u64, HashSet<u32>>,
    /// Highest barrier released.
    released: u64,
    /// Rank 0: ranks that finished in order.
    done: HashSet<u32>,
    /// This rank is shutting down in order: closed sockets are expected.
    finishing: bool,
    last_seen: HashMap<u32, Instant>,
}

struct Peer {
    rank: u32,
    stream: Mutex<TcpStream>,
}

struct Shared {
    rank: u32,
    world_size: u32,
    config: Config,
    state: Mutex<State>,
    cv: Condvar,
    peers: Vec<Peer>,
    stop: AtomicBool,
    hook: Mutex<Option<FailureHook>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread cannot leave these plain records inconsistent, so a poisoned
    // lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn send(&self, peer: &Peer, tag: u8, payload: &[u8]) -> io::Result<()> {
        write_msg(&mut lock(&peer.stream), tag, payload)
    }

    /// Sends to every peer except `skip`; write errors are left to the readers, which
    /// see the same broken connection.
    fn broadcast(&self, tag: u8, payload: &[u8], skip: Option<u32>) {
        for p in &self.peers {
            if Some(p.rank) != skip {
                let _ = self.send(p, tag, payload);
            }
        }
    }

    /// Records a failure (the first one wins), tells the other ranks when this is rank 0,
    /// and applies the policy.
    fn fail(&self, f: RankFailure) {
        {
            let mut st = lock(&self.state);
            if st.failure.is_some() || st.finishing {
                return;
            }
            st.failure = Some(f.clone());
            self.cv.notify_all();
        }
        if self.rank == 0 || f.rank == Some(self.rank) {
            self.broadcast(T_FAILED, &failed_payload(&f), f.rank);
        }
        if self.config.on_failure == OnFailure::Exit {
            if let Some(h) = lock(&self.hook).as_ref() {
                h(&f);
            }
            let ev = Event::Error {
                kind: ErrorKind::Distributed,
                message: format!("rank {}: {f}", self.rank),
            };
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{}", ev.to_line());
            let _ = out.flush();
            eprintln!("bench: rank {}: {f}; exiting", self.rank);
            std::process::exit(crate::exit::worker::DISTRIBUTED);
        }
    }

    fn arrive(&self, rank: u32, seq: u64) {
        let release = {
            let mut st = lock(&self.state);
            let set = st.arrivals.entry(seq).or_default();
            set.insert(rank);
            if set.len() as u32 == self.world_size {
                st.arrivals.remove(&seq);
                st.released = st.released.max(seq);
                self.cv.notify_all();
                true
            } else {
                false
            }
        };
        if release {
            self.broadcast(T_RELEASE, &seq.to_be_bytes(), None);
        }
    }

    fn reader(self: Arc<Self>, peer_rank: u32, mut stream: TcpStream) {
        loop {
            let msg = read_msg(&mut stream);
            lock(&self.state)
                .last_seen
                .insert(peer_rank, Instant::now());
            match msg {
                Ok((T_BARRIER, p)) if self.rank == 0 => {
                    if let Some(seq) = u64_payload(&p) {
                        self.arrive(peer_rank, seq);
                    }
                }
                Ok((T_RELEASE, p)) => {
                    if let Some(seq) = u64_payload(&p) {
                        let mut st = lock(&self.state);
                        st.released = st.released.max(seq);
                        self.cv.notify_all();
                    }
                }
                Ok((T_FAILED, p)) => self.fail(parse_failed(&p)),
                Ok((T_DONE, _)) => {
                    lock(&self.state).done.insert(peer_rank);
                    self.cv.notify_all();
                }
                Ok(_) => {}
                Err(e) => {
                    let expected = self.stop.load(Ordering::SeqCst) || {
                        let st = lock(&self.state);
                        st.finishing || st.done.contains(&peer_rank)
                    };
                    if !expected {
                        self.fail(RankFailure {
                            rank: Some(peer_rank),
                            message: format!(
                                "connection to rank {peer_rank} lost ({e}); its process died or was killed"
                            ),
                        });
                    }
                    return;
                }
            }
        }
    }

    fn monitor(self: Arc<Self>) {
        let mut st = lock(&self.state);
        loop {
            let (g, _) = self
                .cv
                .wait_timeout(st, self.config.heartbeat)
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            if self.stop.load(Ordering::SeqCst) || st.finishing || st.failure.is_some() {
                return;
            }
            let now = Instant::now();
            let silent = self.peers.iter().find(|p| {
                !st.done.contains(&p.rank)
                    && st
                        .last_seen
                        .get(&p.rank)
                        .is_some_and(|t| now.duration_since(*t) > self.config.peer_timeout)
            });
            if let Some(p) = silent {
                let f = RankFailure {
                    rank: Some(p.rank),
                    message: format!(
                        "no heartbeat from rank {} for {:.0}s (host hung or network cut)",
                        p.rank,
                        self.config.peer_timeout.as_secs_f64()
                    ),
                };
                drop(st);
                self.fail(f);
                return;
            }
            drop(st);
            self.broadcast(T_HEARTBEAT, &[], None);
            st = lock(&self.state);
        }
    }
}

/// A joined rank's handle on the control channel. Dropping it without
/// [`Rendezvous::finish`] closes the channel abruptly, which the others treat as this
/// rank's failure.
pub struct Rendezvous {
    shared: Arc<Shared>,
    next_barrier: AtomicU64,
    finished: bool,
}

impl fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world_size)
            .finish()
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Joins the world: rank 0 calls `make_blob` and serves the result, other ranks receive
/// it. Returns the handle and the blob.
pub fn join<F>(
    env: &DistEnv,
    config: Config,
    make_blob: F,
) -> Result<(Rendezvous, Vec<u8>), RendezvousError>
where
    F: FnOnce() -> Result<Vec<u8>, String>,
{
    let start = Instant::now();
    let deadline = start + config.join_timeout;
    let (peers, blob) = if env.world_size == 1 {
        (Vec::new(), make_blob().map_err(RendezvousError::Blob)?)
    } else if env.rank == 0 {
        serve(env, deadline, start, make_blob)?
    } else {
        connect(env, deadline, start)?
    };
    let shared = Arc::new(Shared {
        rank: env.rank,
        world_size: env.world_size,
        config,
        state: Mutex::new(State::default()),
        cv: Condvar::new(),
        peers: peers
            .iter()
            .map(|(r, s)| {
                s.try_clone().map(|c| Peer {
                    rank: *r,
                    stream: Mutex::new(c),
                })
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot duplicate a socket: {e}"),
            })?,
        stop: AtomicBool::new(false),
        hook: Mutex::new(None),
    });
    let now = Instant::now();
    for (r, s) in peers {
        lock(&shared.state).last_seen.insert(r, now);
        // Writes must not block forever on a peer that stopped reading.
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
        let _ = s.set_read_timeout(None);
        let sh = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("rdzv-read-{r}"))
            .spawn(move || sh.reader(r, s))
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot start a thread: {e}"),
            })?;
    }
    if !shared.peers.is_empty() {
        let sh = Arc::clone(&shared);
        thread::Builder::new()
            .name("rdzv-monitor".into())
            .spawn(move || sh.monitor())
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot start a thread: {e}"),
            })?;
    }
    Ok((
        Rendezvous {
            shared,
            next_barrier: AtomicU64::new(1),
            finished: false,
        },
        blob,
    ))
}

type Joined = (Vec<(u32, TcpStream)>, Vec<u8>);

fn serve<F>(
    env: &DistEnv,
    deadline: Instant,
    start: Instant,
    make_blob: F,
) -> Result<Joined, RendezvousError>
where
    F: FnOnce() -> Result<Vec<u8>, String>,
{
    let blob = make_blob();
    // Listen on every interface, as torchrun does: MASTER_ADDR is how the others reach
    // this host, which need not be an address of one of its interfaces (NAT, aliases).
    let v6 = (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .map(|mut a| a.all(|a| a.is_ipv6()))
        .unwrap_or(false);
    let bind: SocketAddr = if v6 {
        (std::net::Ipv6Addr::UNSPECIFIED, env.master_port).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, env.master_port).into()
    };
    let listener = TcpListener::bind(bind).map_err(|source| RendezvousError::Bind {
        port: env.master_port,
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| RendezvousError::Bind {
            port: env.master_port,
            source,
        })?;
    let mut joined: Vec<(u32, TcpStream)> = Vec::new();
    let mut bad: Option<String> = None;
    while joined.len() + 1 < env.world_size as usize && bad.is_none() {
        if Instant::now() >= deadline {
            break;
        }
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(
                    remaining(deadline)
                        .max(Duration::from_millis(100))
                        .min(Duration::from_secs(10)),
                ));
                match read_hello(&mut s) {
                    Ok((r, w)) if w != env.world_size => {
                        bad = Some(format!(
                            "rank {r} (from {from}) has WORLD_SIZE={w}, rank 0 has {}",
                            env.world_size
                        ));
                    }
                    Ok((r, _)) if r == 0 || r >= env.world_size => {
                        bad = Some(format!("a peer from {from} says it is rank {r}"));
                    }
                    Ok((r, _)) if joined.iter().any(|(j, _)| *j == r) => {
                        bad = Some(format!("two processes say they are rank {r}"));
                    }
                    Ok((r, _)) => joined.push((r, s)),
                    // A stray connection (a port scanner, a stale rank): ignore it.
                    Err(_) => {}
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => bad = Some(format!("accept failed: {e}")),
        }
    }
    let refuse = |joined: &mut Vec<(u32, TcpStream)>, msg: &str| {
        let f = RankFailure {
            rank: Some(0),
            message: msg.to_string(),
        };
        for (_, s) in joined.iter_mut() {
            let _ = write_msg(s, T_FAILED, &failed_payload(&f));
        }
    };
    if let Some(detail) = bad {
        refuse(&mut joined, &detail);
        return Err(RendezvousError::Protocol {
            endpoint: env.endpoint(),
            detail,
        });
    }
    if joined.len() + 1 < env.world_size as usize {
        let have: BTreeSet<u32> = joined.iter().map(|(r, _)| *r).collect();
        let missing: Vec<u32> = (1..env.world_size).filter(|r| !have.contains(r)).collect();
        let err = RendezvousError::MissingRanks {
            endpoint: env.endpoint(),
            missing,
            world_size: env.world_size,
            waited_s: start.elapsed().as_secs_f64(),
        };
        refuse(&mut joined, &err.to_string());
        return Err(err);
    }
    let blob = match blob {
        Ok(b) => b,
        Err(e) => {
            refuse(
                &mut joined,
                &format!("rank 0 could not make the rendezvous id: {e}"),
            );
            return Err(RendezvousError::Blob(e));
        }
    };
    for (r, s) in joined.iter_mut() {
        write_msg(s, T_BLOB, &blob).map_err(|e| RendezvousError::Protocol {
            endpoint: env.endpoint(),
            detail: format!("sending the id to rank {r}: {e}"),
        })?;
    }
    Ok((joined, blob))
}

fn read_hello(s: &mut TcpStream) -> io::Result<(u32, u32)> {
    let (tag, p) = read_msg(s)?;
    if tag != T_HELLO || p.len() != 16 || &p[..8] != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a bench hello",
        ));
    }
    let r = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
    let w = u32::from_be_bytes([p[12], p[13], p[14], p[15]]);
    Ok((r, w))
}

fn connect(env: &DistEnv, deadline: Instant, start: Instant) -> Result<Joined, RendezvousError> {
    let endpoint = env.endpoint();
    let mut backoff = Duration::from_millis(20);
    let mut stream = loop {
        let attempt = (env.master_addr.as_str(), env.master_port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", env.master_addr))
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| format!("{} resolves to no address", env.master_addr))
            })
            .and_then(|addr| {
                let t =
                    remaining(deadline).clamp(Duration::from_millis(10), Duration::from_secs(2));
                TcpStream::connect_timeout(&addr, t).map_err(|e| e.to_string())
            });
        let last_error = match attempt {
            Ok(s) => break s,
            Err(e) => e,
        };
        if Instant::now() + backoff >= deadline {
            return Err(RendezvousError::Unreachable {
                rank: env.rank,
                endpoint,
                waited_s: start.elapsed().as_secs_f64(),
                last_error,
            });
        }
        thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(500));
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&env.rank.to_be_bytes());
    hello.extend_from_slice(&env.world_size.to_be_bytes());
    let proto = |detail: String| RendezvousError::Protocol {
        endpoint: endpoint.clone(),
        detail,
    };
    write_msg(&mut stream, T_HELLO, &hello).map_err(|e| proto(format!("sending hello: {e}")))?;
    // Wait a little past our own deadline: rank 0's deadline is the same, and its message
    // naming the missing ranks is a better error than our own timeout.
    let wait = remaining(deadline) + Duration::from_secs(3);
    let _ = stream.set_read_timeout(Some(wait));
    match read_msg(&mut stream) {
        Ok((T_BLOB, blob)) => Ok((vec![(0, stream)], blob)),
        Ok((T_FAILED, p)) => Err(RendezvousError::PeerFailed(parse_failed(&p))),
        Ok((t, _)) => Err(proto(format!("unexpected message {t} instead of the id"))),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(RendezvousError::Timeout {
                rank: env.rank,
                what: "waiting for rank 0 to send the id",
                waited_s: start.elapsed().as_secs_f64(),
            })
        }
        Err(e) => Err(RendezvousError::PeerFailed(RankFailure {
            rank: Some(0),
            message: format!("rank 0 closed the rendezvous before sending the id ({e})"),
        })),
    }
}

impl Rendezvous {
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    pub fn world_size(&self) -> u32 {
        self.shared.world_size
    }

    /// Sets what runs before the process exits on a peer's failure ([`OnFailure::Exit`]).
    pub fn set_failure_hook(&self, hook: FailureHook) {
        *lock(&self.shared.hook) = Some(hook);
    }

    /// The first failure learned so far.
    pub fn failure(&self) -> Option<RankFailure> {
        lock(&self.shared.state).failure.clone()
    }

    /// Waits up to `timeout` for a failure to be learned.
    pub fn wait_for_failure(&self, timeout: Duration) -> Option<RankFailure> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        while st.failure.is_none() {
            let left = remaining(deadline);
            if left.is_zero() {
                return None;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.failure.clone()
    }

    /// Waits until every rank has reached the same barrier (ranks must call barriers in
    /// the same order), a rank fails, or `timeout` passes.
    pub fn barrier(&self, timeout: Duration) -> Result<(), RendezvousError> {
        let start = Instant::now();
        let seq = self.next_barrier.fetch_add(1, Ordering::SeqCst);
        let sh = &self.shared;
        if sh.world_size == 1 {
            return Ok(());
        }
        if sh.rank == 0 {
            sh.arrive(0, seq);
        } else if let Some(p) = sh.peers.first() {
            if let Err(e) = sh.send(p, T_BARRIER, &seq.to_be_bytes()) {
                sh.fail(RankFailure {
                    rank: Some(0),
                    message: format!("cannot reach rank 0 ({e})"),
                });
            }
        }
        let deadline = start + timeout;
        let mut st = lock(&sh.state);
        loop {
            if let Some(f) = &st.failure {
                return Err(RendezvousError::PeerFailed(f.clone()));
            }
            if st.released >= seq {
                return Ok(());
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(RendezvousError::Timeout {
                    rank: sh.rank,
                    what: "barrier",
                    waited_s: start.elapsed().as_secs_f64(),
                });
            }
            st = sh
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells the other ranks that this rank failed (before it exits with an error of its
    /// own), so they stop at once instead of waiting in a collective.
    pub fn report_failure(&self, message: &str) {
        let f = RankFailure {
            rank: Some(self.shared.rank),
            message: message.to_string(),
        };
        {
            let mut st = lock(&self.shared.state);
            if st.failure.is_none() {
                st.failure = Some(f.clone());
            }
        }
        self.shared.broadcast(T_FAILED, &failed_payload(&f), None);
    }

    /// Orderly end: the other ranks tell rank 0 they are done; rank 0 waits (up to
    /// `timeout`) until they all have, so its closing the channel is not taken as a failure.
    pub fn finish(mut self, timeout: Duration) -> Result<(), RendezvousError> {
        self.finished = true;
        let sh = Arc::clone(&self.shared);
        let result = if sh.rank == 0 {
            let deadline = Instant::now() + timeout;
            let mut st = lock(&sh.state);
            loop {
                if let Some(f) = &st.failure {
                    break Err(RendezvousError::PeerFailed(f.clone()));
                }
                if st.done.len() + 1 >= sh.world_size as usize {
                    st.finishing = true;
                    break Ok(());
                }
                let left = remaining(deadline);
                if left.is_zero() {
                    break Err(RendezvousError::Timeout {
                        rank: 0,
                        what: "waiting for the other ranks to finish",
                        waited_s: timeout.as_secs_f64(),
                    });
                }
                st = sh
                    .cv
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        } else {
            lock(&sh.state).finishing = true;
            sh.broadcast(T_DONE, &[], None);
            Ok(())
        };
        self.close();
        result
    }

    fn close(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        for p in &self.shared.peers {
            let _ = lock(&p.stream).shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if !self.finished {
            // Abrupt: the peers see the connection close and treat this rank as failed,
            // which is what an error path that forgot `report_failure` should cause.
            self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn env_contract_parses_and_round_trips() {
        let e = DistEnv::from_lookup(env_of(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node-a"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(e.rank, 3);
        assert_eq!(e.local_world_size, 4);
        let back: HashMap<String, String> = e.to_env().into_iter().collect();
        assert_eq!(
            DistEnv::from_lookup(|k| back.get(k).cloned()).unwrap(),
            Some(e)
        );
    }

    #[test]
    fn env_absent_is_single_process_and_bad_values_name_the_variable() {
        assert_eq!(DistEnv::from_lookup(env_of(&[])).unwrap(), None);
        let err = DistEnv::from_lookup(env_of(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("RANK=\"x\""), "{err}");
        let err = DistEnv::from_lookup(env_of(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("below WORLD_SIZE=2"), "{err}");
        let err = DistEnv::from_lookup(env_of(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
        let one = DistEnv::from_lookup(env_of(&[("RANK", "0"), ("WORLD_SIZE", "1")]))
            .unwrap()
            .unwrap();
        assert_eq!(one.master_addr, "127.0.0.1");
    }

    #[test]
    fn join_timeout_comes_from_the_environment() {
        let c = Config::from_lookup(env_of(&[(ENV_JOIN_TIMEOUT, "12.5")])).unwrap();
        assert_eq!(c.join_timeout, Duration::from_millis(12500));
        assert_eq!(c.on_failure, OnFailure::Exit);
        assert!(Config::from_lookup(env_of(&[(ENV_JOIN_TIMEOUT, "-1")])).is_err());
        assert_eq!(
            Config::from_lookup(env_of(&[])).unwrap().join_timeout,
            Duration::from_secs(300)
        );
    }

    #[test]
    fn failure_messages_round_trip_on_the_wire() {
        let f = RankFailure {
            rank: Some(7),
            message: "CUDA out of memory".into(),
        };
        assert_eq!(parse_failed(&failed_payload(&f)), f);
        let g = RankFailure {
            rank: None,
            message: "lost".into(),
        };
        assert_eq!(parse_failed(&failed_payload(&g)), g);
    }
}
