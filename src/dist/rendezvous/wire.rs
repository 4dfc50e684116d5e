//! The control channel's wire format: tagged, length-prefixed messages, and the hello
//! every connecting rank opens with (magic, version, its rank and world size), so that a
//! stray connection is refused.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use super::error::RankFailure;

/// Protocol magic and version, sent in every hello so a stray connection is refused.
pub(super) const MAGIC: &[u8; 8] = b"BENCHRV1";
/// Largest message accepted (the blob is 128 bytes; failure texts are short).
pub(super) const MAX_MSG: u32 = 1 << 20;

// Message tags on the wire: tag (1 byte), payload length (u32 big-endian), payload.
pub(super) const T_HELLO: u8 = 1;
pub(super) const T_BLOB: u8 = 2;
pub(super) const T_BARRIER: u8 = 3;
pub(super) const T_RELEASE: u8 = 4;
pub(super) const T_FAILED: u8 = 5;
pub(super) const T_DONE: u8 = 6;
pub(super) const T_HEARTBEAT: u8 = 7;

pub(super) fn write_msg(s: &mut TcpStream, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(tag);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
    s.write_all(&buf)?;
    s.flush()
}

pub(super) fn read_msg(s: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
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

pub(super) fn failed_payload(f: &RankFailure) -> Vec<u8> {
    let mut p = f
        .rank
        .map(|r| r as i64)
        .unwrap_or(-1)
        .to_be_bytes()
        .to_vec();
    p.extend_from_slice(f.message.as_bytes());
    p
}

pub(super) fn parse_failed(p: &[u8]) -> RankFailure {
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

pub(super) fn u64_payload(p: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(p).ok().map(u64::from_be_bytes)
}

pub(super) fn read_hello(s: &mut TcpStream) -> io::Result<(u32, u32)> {
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
