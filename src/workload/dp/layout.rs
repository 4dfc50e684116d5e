//! How a data-parallel unit's parameters lie in one flat buffer and how that buffer is
//! split across the ranks: each parameter aligned, decayed ones first, padded to a
//! multiple of `world x ALIGN` so every rank's slice is equal and aligned.

use std::ops::Range;

/// Alignment of every parameter and every rank's slice in a unit's flat buffer, in
/// elements: 128 bytes in bf16, so views keep the alignment vectorised kernels want.
pub(crate) const ALIGN: usize = 64;

/// One parameter's place in its unit's flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Index into the model's parameter list.
    pub param: usize,
    pub offset: usize,
    pub numel: usize,
}

/// How one unit's parameters are laid out and split across the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnitLayout {
    /// Decayed parameters first, in model order, then the others.
    pub slots: Vec<Slot>,
    /// Elements below this offset belong to decayed parameters (or their padding).
    pub decay_end: usize,
    /// Length of the flat buffer: a multiple of `world x ALIGN`.
    pub padded: usize,
    /// Length of each rank's slice (`padded / world`).
    pub shard: usize,
}

fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

impl UnitLayout {
    /// Lays out parameters given as `(param index, numel, decay)` for `world` ranks.
    pub(crate) fn new(params: &[(usize, usize, bool)], world: usize) -> UnitLayout {
        let world = world.max(1);
        let mut slots = Vec::with_capacity(params.len());
        let (mut off, mut decay_end) = (0, 0);
        for pass in [true, false] {
            for &(param, numel, decay) in params {
                if decay == pass {
                    slots.push(Slot {
                        param,
                        offset: off,
                        numel,
                    });
                    off = round_up(off + numel, ALIGN);
                }
            }
            if pass {
                // Offsets stay aligned, so the decayed region ends on an aligned offset.
                decay_end = off;
            }
        }
        let padded = round_up(off.max(1), world * ALIGN);
        UnitLayout {
            slots,
            decay_end,
            padded,
            shard: padded / world,
        }
    }

    /// The padding of the flat buffer: between the parameters and after the last.
    pub(crate) fn gaps(&self) -> Vec<Range<usize>> {
        let mut slots: Vec<&Slot> = self.slots.iter().collect();
        slots.sort_by_key(|s| s.offset);
        let mut out = Vec::new();
        let mut end = 0;
        for s in slots {
            if s.offset > end {
                out.push(end..s.offset);
            }
            end = s.offset + s.numel;
        }
        if self.padded > end {
            out.push(end..self.padded);
        }
        out
    }

    /// The parts of rank `rank`'s slice, relative to the slice's start, with whether AdamW
    /// decays them: at most one decayed and one undecayed range, empty ones left out.
    pub(crate) fn pieces(&self, rank: usize) -> Vec<(Range<usize>, bool)> {
        let (lo, hi) = (rank * self.shard, (rank + 1) * self.shard);
        let mut out = Vec::with_capacity(2);
        let cut = self.decay_end.clamp(lo, hi);
        if cut > lo {
            out.push((0..cut - lo, true));
        }
        if hi > cut {
            out.push((cut - lo..hi - lo, false));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_puts_decayed_params_first_aligned_and_padded() {
        // (index, numel, decay): a norm, a matrix, a bias, a matrix.
        let ps = [(0, 10, false), (1, 100, true), (2, 3, false), (3, 70, true)];
        let l = UnitLayout::new(&ps, 4);
        let offs: Vec<(usize, usize)> = l.slots.iter().map(|s| (s.param, s.offset)).collect();
        assert_eq!(offs, vec![(1, 0), (3, 128), (0, 256), (2, 320)]);
        assert_eq!(l.decay_end, 256);
        assert_eq!(l.padded, 512); // 323 rounded up to 4 x 64
        assert_eq!(l.shard, 128);
        for s in &l.slots {
            assert_eq!(s.offset % ALIGN, 0);
        }
    }

    #[test]
    fn pieces_cover_every_slice_and_split_at_the_decay_boundary() {
        let ps = [(0, 10, false), (1, 100, true), (2, 3, false), (3, 70, true)];
        for world in [1, 2, 3, 4, 8] {
            let l = UnitLayout::new(&ps, world);
            let mut covered = 0;
            for r in 0..world {
                let pieces = l.pieces(r);
                assert!(!pieces.is_empty() && pieces.len() <= 2);
                let mut next = 0;
                for (range, decay) in pieces {
                    assert_eq!(range.start, next, "world {world} rank {r}");
                    next = range.end;
                    let (lo, hi) = (r * l.shard + range.start, r * l.shard + range.end);
                    if decay {
                        assert!(hi <= l.decay_end);
                    } else {
                        assert!(lo >= l.decay_end);
                    }
                }
                assert_eq!(next, l.shard);
                covered += next;
            }
            assert_eq!(covered, l.padded);
        }
    }

    #[test]
    fn gaps_are_the_padding_between_and_after_the_parameters() {
        // 10 decayed elements at 0, 3 undecayed at 64; padded to a multiple of 4 x 64.
        let l = UnitLayout::new(&[(0, 10, true), (1, 3, false)], 4);
        assert_eq!(l.padded, 256);
        assert_eq!(l.gaps(), vec![10..64, 67..256]);
        // A parameter filling its aligned slot leaves no gap before the next.
        let l = UnitLayout::new(&[(0, 64, true), (1, 64, true)], 1);
        assert_eq!(l.gaps(), Vec::<Range<usize>>::new());
    }

    #[test]
    fn a_unit_without_decayed_params_is_all_undecayed() {
        let l = UnitLayout::new(&[(0, 5, false)], 2);
        assert_eq!(l.decay_end, 0);
        assert_eq!(l.pieces(0), vec![(0..64, false)]);
        assert_eq!(l.pieces(1), vec![(0..64, false)]);
    }
}
