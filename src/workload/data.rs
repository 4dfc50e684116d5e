//! Training data: seeded synthetic tokens (uniform random, or a learnable pattern whose loss
//! falls), or a token file (`.bin` of little-endian uint16 or uint32 token ids).
//!
//! Batches are produced on the host as `[B, T + 1]` windows and split into inputs and
//! next-token targets; the trainer copies them to the device.

use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

/// Where tokens come from.
pub(crate) enum Source {
    /// Uniform random tokens: no structure to learn, the default benchmark load.
    Random,
    /// Each row starts at a random token and continues `t -> (5 t + 1) mod vocab`, a
    /// deterministic bigram that even tiny models learn within tens of steps.
    Pattern,
    /// Consecutive windows of a token file, wrapping at its end.
    File { tokens: Vec<u32>, pos: usize },
}

/// Failures reading a token file, each naming the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DataError {
    #[error("{path}: cannot read token file: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: --data-bytes must be 2 (uint16) or 4 (uint32), got {width}")]
    Width { path: PathBuf, width: u8 },
    #[error("{path}: file length {len} is not a multiple of the {width}-byte token width")]
    Ragged {
        path: PathBuf,
        len: usize,
        width: u8,
    },
    #[error("{path}: {count} tokens, fewer than one sequence of {need}")]
    TooShort {
        path: PathBuf,
        count: usize,
        need: usize,
    },
    #[error("{path}: token {token} at index {index} is outside the model's vocabulary of {vocab}")]
    OutOfVocab {
        path: PathBuf,
        token: u32,
        index: usize,
        vocab: i64,
    },
}

/// A seeded stream of batches.
pub(crate) struct Batches {
    source: Source,
    rng: SplitMix64,
    vocab: i64,
    batch: usize,
    seq: usize,
}

impl Batches {
    pub(crate) fn new(source: Source, seed: u64, vocab: i64, batch: usize, seq: usize) -> Batches {
        Batches {
            source,
            rng: SplitMix64(seed ^ 0x005E_ED0F_BE7C),
            vocab,
            batch,
            seq,
        }
    }

    /// Reads a token file of `width`-byte little-endian ids, checking every id against the
    /// vocabulary so a wrong `--data-bytes` or tokenizer fails up front, not as a CUDA assert.
    pub(crate) fn read_file(
        path: &Path,
        width: u8,
        vocab: i64,
        seq: usize,
    ) -> Result<Source, DataError> {
        // A data set may be gigabytes: bounded only at 1 TiB, but a regular file only (a FIFO
        // would hang the worker, a device would never end).
        let bytes = crate::files::open_regular(path)
            .and_then(|f| crate::files::read_open_bounded(f, 1 << 40))
            .map_err(|source| DataError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let w = match width {
            2 | 4 => width as usize,
            _ => {
                return Err(DataError::Width {
                    path: path.to_path_buf(),
                    width,
                })
            }
        };
        if bytes.len() % w != 0 {
            return Err(DataError::Ragged {
                path: path.to_path_buf(),
                len: bytes.len(),
                width,
            });
        }
        let tokens: Vec<u32> = bytes
            .chunks_exact(w)
            .map(|c| match c {
                [a, b] => u16::from_le_bytes([*a, *b]) as u32,
                [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
                _ => unreachable!("chunks_exact yields chunks of the width"),
            })
            .collect();
        if tokens.len() < seq + 1 {
            return Err(DataError::TooShort {
                path: path.to_path_buf(),
                count: tokens.len(),
                need: seq + 1,
            });
        }
        if let Some((index, &token)) = tokens.iter().enumerate().find(|(_, &t)| t as i64 >= vocab) {
            return Err(DataError::OutOfVocab {
                path: path.to_path_buf(),
                token,
                index,
                vocab,
            });
        }
        Ok(Source::File { tokens, pos: 0 })
    }

    /// Passes over `n` batches: the ranks of a data-parallel run read one shared stream,
    /// each keeping its own slice of every step, so that together they see exactly the
    /// batches one process would (what makes DDP comparable with a single-GPU run).
    pub(crate) fn skip(&mut self, n: usize) {
        for _ in 0..n {
            let _ = self.next_batch();
        }
    }

    /// The next batch as host tensors (inputs, targets), each `[B, T]` int64.
    pub(crate) fn next_batch(&mut self) -> (Tensor, Tensor) {
        let (b, t) = (self.batch, self.seq);
        let mut buf: Vec<i64> = Vec::with_capacity(b * (t + 1));
        let v = self.vocab as u64;
        for _ in 0..b {
            match &mut self.source {
                Source::Random => buf.extend((0..=t).map(|_| (self.rng.next() % v) as i64)),
                Source::Pattern => {
                    let mut x = self.rng.next() % v;
                    for _ in 0..=t {
                        buf.push(x as i64);
                        x = (5 * x + 1) % v;
                    }
                }
                Source::File { tokens, pos } => {
                    if *pos + t + 1 > tokens.len() {
                        *pos = 0;
                    }
                    buf.extend(tokens[*pos..*pos + t + 1].iter().map(|&x| x as i64));
                    *pos += t + 1;
                }
            }
        }
        let all = Tensor::from_slice(&buf).view([b as i64, t as i64 + 1]);
        let x = all.narrow(1, 0, t as i64).contiguous();
        let y = all.narrow(1, 1, t as i64).contiguous();
        debug_assert_eq!(x.kind(), Kind::Int64);
        (x, y)
    }
}

/// SplitMix64: a tiny, well-mixed, seedable generator; the data only needs to be
/// reproducible, not cryptographic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_slicing_one_stream_see_the_single_process_batches() {
        // Two ranks, grad_accum 2: rank r takes batches 2r, 2r+1 of every step's four.
        let mk = || Batches::new(Source::Random, 7, 50, 2, 8);
        let mut one = mk();
        let single: Vec<Tensor> = (0..8).map(|_| one.next_batch().0).collect();
        for rank in 0..2usize {
            let mut b = mk();
            for step in 0..2usize {
                b.skip(rank * 2);
                for j in 0..2 {
                    let x = b.next_batch().0;
                    assert!(
                        x.equal(&single[step * 4 + rank * 2 + j]),
                        "rank {rank} step {step}"
                    );
                }
                b.skip((1 - rank) * 2);
            }
        }
    }

    fn to_vec(t: &Tensor) -> Vec<i64> {
        Vec::<i64>::try_from(t.flatten(0, -1)).unwrap()
    }

    #[test]
    fn synthetic_is_seeded_and_in_vocab() {
        let a = Batches::new(Source::Random, 7, 100, 2, 8).next_batch();
        let b = Batches::new(Source::Random, 7, 100, 2, 8).next_batch();
        let c = Batches::new(Source::Random, 8, 100, 2, 8).next_batch();
        assert_eq!(to_vec(&a.0), to_vec(&b.0));
        assert_ne!(to_vec(&a.0), to_vec(&c.0));
        assert!(to_vec(&a.0).iter().all(|&t| (0..100).contains(&t)));
        // Targets are the inputs shifted by one.
        assert_eq!(to_vec(&a.0.narrow(1, 1, 7)), to_vec(&a.1.narrow(1, 0, 7)));
    }

    #[test]
    fn pattern_follows_its_rule() {
        let (x, y) = Batches::new(Source::Pattern, 1, 64, 3, 10).next_batch();
        for (xi, yi) in to_vec(&x).iter().zip(to_vec(&y)) {
            assert_eq!((5 * xi + 1) % 64, yi);
        }
    }

    #[test]
    fn token_files_of_both_widths() {
        let dir = tempfile::tempdir().unwrap();
        let toks: Vec<u32> = (0..40).map(|i| (i * 7) % 300).collect();
        let p16 = dir.path().join("t16.bin");
        let p32 = dir.path().join("t32.bin");
        std::fs::write(
            &p16,
            toks.iter()
                .flat_map(|&t| (t as u16).to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        std::fs::write(
            &p32,
            toks.iter()
                .flat_map(|&t| t.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for (p, w) in [(&p16, 2), (&p32, 4)] {
            let src = Batches::read_file(p, w, 300, 9).unwrap();
            let mut b = Batches::new(src, 0, 300, 2, 9);
            let (x, y) = b.next_batch();
            let want: Vec<i64> = toks.iter().take(20).map(|&t| t as i64).collect();
            assert_eq!(to_vec(&x), [&want[0..9], &want[10..19]].concat());
            assert_eq!(to_vec(&y), [&want[1..10], &want[11..20]].concat());
            // Two windows of 10 used 20 tokens; the next batch wraps after 40.
            let _ = b.next_batch();
            let (x3, _) = b.next_batch();
            assert_eq!(to_vec(&x3)[0], want[0]);
        }
        assert!(matches!(
            Batches::read_file(&p32, 4, 100, 9),
            Err(DataError::OutOfVocab { .. })
        ));
        assert!(matches!(
            Batches::read_file(&p16, 2, 300, 100),
            Err(DataError::TooShort { .. })
        ));
        assert!(matches!(
            Batches::read_file(&p16, 3, 300, 9),
            Err(DataError::Width { .. })
        ));
        let odd = dir.path().join("odd.bin");
        std::fs::write(&odd, [1u8, 2, 3]).unwrap();
        assert!(matches!(
            Batches::read_file(&odd, 2, 300, 1),
            Err(DataError::Ragged { .. })
        ));
    }
}
