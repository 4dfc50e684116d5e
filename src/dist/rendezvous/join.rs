//! Joining the world: rank 0 listens and serves the blob to every rank that says hello;
//! the other ranks connect (retrying until the deadline) and receive it.

use std::collections::BTreeSet;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::config::remaining;
use super::env::DistEnv;
use super::error::{RankFailure, RendezvousError};
use super::wire::{
    failed_payload, parse_failed, read_hello, read_msg, write_msg, MAGIC, T_BLOB, T_FAILED, T_HELLO,
};

pub(super) type Joined = (Vec<(u32, TcpStream)>, Vec<u8>);

pub(super) fn serve<F>(
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

pub(super) fn connect(
    env: &DistEnv,
    deadline: Instant,
    start: Instant,
) -> Result<Joined, RendezvousError> {
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
