//! A partition plan: which rank of a group of `n` reads which bytes of a checkpoint, so that each
//! byte is read once across the group and every rank reads about `total / n`.
//!
//! The tensors, in checkpoint order, are laid end to end and the stream is cut into `n` equal
//! byte ranges; rank `r` owns range `r`. A tensor inside one range goes whole to its rank. A
//! tensor that straddles a cut is split there, at the nearest row of its first dimension, into
//! one piece per rank (each piece is a row range the `Loader` reads with
//! [`RowRange::Rows`](crate::RowRange)); a tensor that has no rows to split (a scalar, one row,
//! rows that are not whole bytes) goes whole to the rank that holds its middle byte. Because each
//! rank's range is contiguous, a rank owns at most one piece of any tensor.
//!
//! The plan depends only on the tensors' names, dtypes, shapes and order, never on paths or
//! anything else that differs between machines, so every rank computes the same plan without
//! communicating; [`Plan::fingerprint`] lets ranks check that they did.

use std::ops::Range;

use super::{Checkpoint, RowRange, Selection, TensorMeta};
use crate::error::{Error, Result};

/// One piece of one tensor and the rank that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's position in [`Checkpoint::tensors`].
    pub tensor: usize,
    /// The tensor's name.
    pub name: String,
    /// The rows of dimension 0 this piece holds; `None` for the whole tensor.
    pub rows: Option<Range<usize>>,
    /// Where the piece starts in the tensor's bytes.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
    /// The rank that reads it.
    pub owner: usize,
}

/// Which rank reads which piece of every tensor: the tensors laid end to end are cut into
/// `n` equal byte ranges, rank `r` owns range `r`, and a tensor straddling a cut is split at
/// the nearest row of its first dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    ranks: usize,
    pieces: Vec<Piece>,
    total: u64,
    fingerprint: u64,
}

/// FNV-1a, 64 bits: a hash every build and every language computes the same way.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn number(&mut self, n: u64) {
        self.bytes(&n.to_le_bytes());
    }
}

/// The bytes of one row of dimension 0, and the rows, when the tensor can be cut by rows.
fn rows_of(meta: &TensorMeta) -> Option<(usize, usize)> {
    let (&dim0, rest) = meta.shape.split_first()?;
    let row_bits = rest
        .iter()
        .try_fold(meta.dtype.bitsize(), |acc, &d| acc.checked_mul(d))?;
    if dim0 < 2 || row_bits == 0 || !row_bits.is_multiple_of(8) {
        return None;
    }
    let row_bytes = row_bits / 8;
    (row_bytes.checked_mul(dim0)? == meta.len).then_some((row_bytes, dim0))
}

impl Plan {
    /// The plan for `ranks` ranks over `checkpoint` (as opened, or narrowed by a selection).
    pub fn new(checkpoint: &Checkpoint, ranks: usize) -> Result<Self> {
        if ranks == 0 {
            return Err(Error::Policy("a partition needs at least one rank".into()));
        }
        let total: u64 = checkpoint.total_bytes();
        let n = ranks as u128;
        // Where rank r's range starts in the stream: r * total / n, rounded down.
        let cut = |r: usize| -> u64 { ((r as u128 * u128::from(total)) / n) as u64 };
        // The rank whose range holds stream byte `at` (the last rank for the end).
        let rank_at = |at: u64| -> usize {
            if total == 0 {
                return 0;
            }
            let r = ((u128::from(at) * n) / u128::from(total)) as usize;
            let mut r = r.min(ranks - 1);
            // Rounding: step to the range that really holds `at`.
            while r > 0 && cut(r) > at {
                r -= 1;
            }
            while r + 1 < ranks && cut(r + 1) <= at {
                r += 1;
            }
            r
        };
        let mut fingerprint = Fnv::new();
        fingerprint.number(ranks as u64);
        let mut pieces = Vec::new();
        let mut start = 0u64;
        for (index, meta) in checkpoint.tensors().iter().enumerate() {
            fingerprint.bytes(meta.name.as_bytes());
            fingerprint.bytes(meta.dtype_name().as_bytes());
            for &d in &meta.shape {
                fingerprint.number(d as u64);
            }
            fingerprint.number(meta.len as u64);
            let end = start + meta.len as u64;
            let whole = |owner| Piece {
                tensor: index,
                name: meta.name.clone(),
                rows: None,
                offset: 0,
                len: meta.len,
                owner,
            };
            let (first, last) = (rank_at(start), rank_at(end.saturating_sub(1).max(start)));
            match rows_of(meta) {
                _ if meta.len == 0 || first == last => pieces.push(whole(first)),
                None => pieces.push(whole(rank_at(start + meta.len as u64 / 2))),
                Some((row_bytes, dim0)) => {
                    // The row nearest to each cut inside the tensor; empty pieces dropped.
                    let mut bounds = vec![(0usize, first)];
                    for r in first + 1..=last {
                        let into = cut(r) - start;
                        let row = ((into + row_bytes as u64 / 2) / row_bytes as u64) as usize;
                        bounds.push((row.min(dim0), r));
                    }
                    bounds.push((dim0, last));
                    for pair in bounds.windows(2) {
                        let [(a, owner), (b, _)] = [pair[0], pair[1]];
                        if b > a {
                            pieces.push(Piece {
                                tensor: index,
                                name: meta.name.clone(),
                                rows: Some(a..b),
                                offset: a * row_bytes,
                                len: (b - a) * row_bytes,
                                owner,
                            });
                        }
                    }
                }
            }
            start = end;
        }
        for piece in &pieces {
            fingerprint.number(piece.owner as u64);
            fingerprint.number(piece.offset as u64);
            fingerprint.number(piece.len as u64);
        }
        Ok(Self {
            ranks,
            pieces,
            total,
            fingerprint: fingerprint.0,
        })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Every piece, in checkpoint order (a split tensor's pieces in row order).
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The bytes of every tensor together.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// The bytes rank `rank` reads.
    pub fn bytes_of(&self, rank: usize) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.owner == rank)
            .map(|p| p.len as u64)
            .sum()
    }

    /// A hash of the tensors' names, dtypes, shapes and lengths and of the assignment: equal on
    /// two ranks exactly when they planned the same (FNV-1a, the same in every build).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// What rank `rank` loads: its tensors, and the rows of those it owns a piece of.
    pub fn selection(&self, rank: usize) -> Selection {
        let mine: Vec<&Piece> = self.pieces.iter().filter(|p| p.owner == rank).collect();
        let mut selection = Selection::names(mine.iter().map(|p| p.name.clone()));
        for piece in mine {
            if let Some(rows) = &piece.rows {
                selection = selection.rows(piece.name.clone(), RowRange::Rows(rows.clone()));
            }
        }
        selection
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ShardFile;
    use crate::{Checkpoint, Dtype};
    use std::path::Path;
    use std::sync::Arc;

    fn checkpoint(tensors: &[(&str, Dtype, &[usize])]) -> Checkpoint {
        let file: Arc<Path> = Arc::from(Path::new("/nowhere/model.safetensors"));
        let mut offset = 0u64;
        let metas = tensors
            .iter()
            .map(|&(name, dtype, shape)| {
                let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
                let meta = TensorMeta {
                    name: name.to_owned(),
                    dtype,
                    shape: shape.to_vec(),
                    file: Arc::clone(&file),
                    file_index: 0,
                    offset,
                    len,
                    row_range: None,
                };
                offset += len as u64;
                meta
            })
            .collect();
        let shard = ShardFile {
            path: Arc::clone(&file),
            size: offset,
            data_start: 0,
            tensors: tensors.len(),
            identity: crate::checkpoint::FileIdentity {
                dev: 0,
                ino: 0,
                size: offset,
                mtime: 0,
                mtime_nsec: 0,
            },
            metadata: None,
        };
        Checkpoint::from_parts(vec![shard], metas, 0)
    }

    /// Every tensor's bytes covered exactly once, pieces in order, one piece per rank per tensor.
    fn check_cover(ckpt: &Checkpoint, plan: &Plan) {
        for (index, meta) in ckpt.tensors().iter().enumerate() {
            let pieces: Vec<&Piece> = plan.pieces().iter().filter(|p| p.tensor == index).collect();
            let mut at = 0;
            let mut owners = std::collections::BTreeSet::new();
            for p in &pieces {
                assert_eq!(p.offset, at, "{}", meta.name);
                at += p.len;
                assert!(
                    owners.insert(p.owner),
                    "two pieces of {} on one rank",
                    meta.name
                );
                assert!(p.owner < plan.ranks());
            }
            assert_eq!(at, meta.len, "{}", meta.name);
        }
        let sum: u64 = (0..plan.ranks()).map(|r| plan.bytes_of(r)).sum();
        assert_eq!(sum, plan.total_bytes());
    }

    #[test]
    fn one_rank_reads_everything_whole() {
        let ckpt = checkpoint(&[("a", Dtype::F32, &[10, 4]), ("b", Dtype::BF16, &[3])]);
        let plan = Plan::new(&ckpt, 1).unwrap();
        assert!(
            plan.pieces()
                .iter()
                .all(|p| p.owner == 0 && p.rows.is_none())
        );
        check_cover(&ckpt, &plan);
    }

    #[test]
    fn ranks_get_equal_shares_and_a_large_tensor_is_split_by_rows() {
        // "big" is 3/4 of the bytes: larger than total / n for n = 2, 3, 4.
        let ckpt = checkpoint(&[
            ("small0", Dtype::F32, &[16]),
            ("big", Dtype::F16, &[1000, 96]),
            ("small1", Dtype::F32, &[16, 16]),
            ("rest", Dtype::F32, &[250, 32]),
            ("scalar", Dtype::F64, &[]),
        ]);
        let big = &ckpt.tensors()[1];
        let row = 96 * 2;
        for n in 1..=8 {
            let plan = Plan::new(&ckpt, n).unwrap();
            check_cover(&ckpt, &plan);
            let fair = plan.total_bytes() / n as u64;
            for r in 0..n {
                let mine = plan.bytes_of(r);
                // Within a row (or a small unsplittable tensor) of an equal share.
                assert!(
                    mine.abs_diff(fair) <= 2 * row as u64 + 1024,
                    "n={n} r={r}: {mine} vs {fair}"
                );
            }
            let split = plan.pieces().iter().filter(|p| p.tensor == 1).count();
            if n > 1 {
                assert!(
                    split > 1,
                    "n={n}: {} bytes of {} not split",
                    big.len,
                    plan.total_bytes()
                );
            }
        }
    }

    #[test]
    fn the_plan_is_the_same_wherever_it_is_computed_and_says_so() {
        let specs: &[(&str, Dtype, &[usize])] = &[
            ("a", Dtype::F32, &[100, 8]),
            ("b", Dtype::I64, &[7, 3]),
            ("c", Dtype::BF16, &[64]),
        ];
        let one = Plan::new(&checkpoint(specs), 3).unwrap();
        let two = Plan::new(&checkpoint(specs), 3).unwrap();
        assert_eq!(one, two);
        assert_eq!(one.fingerprint(), two.fingerprint());
        assert_ne!(
            one.fingerprint(),
            Plan::new(&checkpoint(specs), 2).unwrap().fingerprint()
        );
        let other: &[(&str, Dtype, &[usize])] = &[
            ("a", Dtype::F32, &[100, 8]),
            ("b", Dtype::I64, &[7, 3]),
            ("c", Dtype::F16, &[64]),
        ];
        assert_ne!(
            one.fingerprint(),
            Plan::new(&checkpoint(other), 3).unwrap().fingerprint()
        );
    }

    #[test]
    fn unsplittable_tensors_go_whole_and_empty_ones_too() {
        let ckpt = checkpoint(&[
            ("one_row", Dtype::F32, &[1, 4096]),
            ("f4_odd_rows", Dtype::F4, &[64, 3]),
            ("empty", Dtype::F32, &[0, 5]),
            ("tail", Dtype::U8, &[64]),
        ]);
        for n in 1..=5 {
            let plan = Plan::new(&ckpt, n).unwrap();
            check_cover(&ckpt, &plan);
            for name in ["one_row", "f4_odd_rows", "empty"] {
                let pieces: Vec<_> = plan.pieces().iter().filter(|p| p.name == name).collect();
                assert_eq!(pieces.len(), 1, "n={n} {name}");
                assert!(pieces[0].rows.is_none());
            }
        }
        assert!(Plan::new(&ckpt, 0).is_err());
    }

    #[test]
    fn a_ranks_selection_narrows_the_checkpoint_to_its_pieces() {
        let ckpt = checkpoint(&[("a", Dtype::F32, &[100, 8]), ("b", Dtype::F32, &[100, 8])]);
        let plan = Plan::new(&ckpt, 3).unwrap();
        let mut read = 0;
        for r in 0..3 {
            let mine = ckpt.select(&plan.selection(r)).unwrap();
            let bytes: usize = mine.tensors().iter().map(|t| t.len).sum();
            assert_eq!(bytes as u64, plan.bytes_of(r));
            for t in mine.tensors() {
                let piece = plan
                    .pieces()
                    .iter()
                    .find(|p| p.owner == r && p.name == t.name)
                    .unwrap();
                assert_eq!(t.len, piece.len);
                assert_eq!(t.row_range, piece.rows);
            }
            read += bytes;
        }
        assert_eq!(read as u64, plan.total_bytes());
    }

    proptest::proptest! {
        /// Any checkpoint, any group: every byte covered once, and no rank reads more than an
        /// equal share plus its largest tensor.
        #[test]
        fn covers_once_and_balances(
            shapes in proptest::collection::vec((0usize..4, 0usize..300, 1usize..40), 1..30),
            n in 1usize..9,
        ) {
            let dtypes = [Dtype::U8, Dtype::BF16, Dtype::F32, Dtype::F4];
            let names: Vec<String> = (0..shapes.len()).map(|i| format!("t{i}")).collect();
            let specs: Vec<(Dtype, Vec<usize>)> = shapes
                .iter()
                .map(|&(d, rows, cols)| {
                    let shape = if rows == 0 { vec![] } else { vec![rows, cols * 2] };
                    (dtypes[d], shape)
                })
                .collect();
            let list: Vec<(&str, Dtype, &[usize])> = names
                .iter()
                .zip(&specs)
                .map(|(name, (dtype, shape))| (name.as_str(), *dtype, shape.as_slice()))
                .collect();
            let ckpt = checkpoint(&list);
            let plan = Plan::new(&ckpt, n).unwrap();
            check_cover(&ckpt, &plan);
            let largest = ckpt.tensors().iter().map(|t| t.len as u64).max().unwrap_or(0);
            for r in 0..n {
                proptest::prop_assert!(plan.bytes_of(r) <= plan.total_bytes() / n as u64 + largest + 1);
            }
        }
    }
}
