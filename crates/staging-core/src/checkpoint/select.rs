//! Selection: which tensors a load reads, and which rows of them.
//!
//! A [`Selection`] becomes a narrowed [`Checkpoint`] ([`Checkpoint::select`]) before anything is
//! read: unselected tensors are simply not in it, and a tensor asked for by a range of its first
//! dimension becomes a tensor whose offset, length and shape cover just those rows (contiguous in
//! the file, since safetensors stores row-major). So the bytes of what was not asked for are
//! never read, by construction.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::{Checkpoint, TensorMeta};
use crate::error::{Error, Result};

type NamePredicate = Arc<dyn Fn(&str) -> bool + Send + Sync>;
type RowsFor = Arc<dyn Fn(&TensorMeta) -> Option<RowRange> + Send + Sync>;

/// Rows of a tensor's first dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowRange {
    /// These rows.
    Rows(Range<usize>),
    /// Part `rank` of `parts` near-equal parts, in order (the first `dim0 % parts` parts have one
    /// row more, as `numpy.array_split`): rank `r` of a tensor-parallel group of `parts` ranks
    /// splitting dimension 0.
    Part {
        /// Which part, from 0.
        rank: usize,
        /// How many parts.
        parts: usize,
    },
}

impl RowRange {
    /// The rows this means for a first dimension of `dim0`; `None` when they do not exist
    /// (past `dim0`, reversed, or a part of none).
    pub fn resolve(&self, dim0: usize) -> Option<Range<usize>> {
        match *self {
            Self::Rows(ref rows) => {
                (rows.start <= rows.end && rows.end <= dim0).then(|| rows.clone())
            }
            Self::Part { rank, parts } => {
                if parts == 0 || rank >= parts {
                    return None;
                }
                let (base, extra) = (dim0 / parts, dim0 % parts);
                let start = rank * base + rank.min(extra);
                let len = base + usize::from(rank < extra);
                Some(start..start + len)
            }
        }
    }
}

impl fmt::Display for RowRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rows(rows) => write!(f, "rows {}..{}", rows.start, rows.end),
            Self::Part { rank, parts } => write!(f, "part {rank} of {parts}"),
        }
    }
}

/// Parses `START:END` (rows `START..END`) or `RANK/PARTS` (part `RANK` of `PARTS`): the spelling
/// of `stage --rows` and of the Python package's `rows=`.
impl std::str::FromStr for RowRange {
    type Err = String;

    fn from_str(spec: &str) -> std::result::Result<Self, String> {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?} in {spec:?} is not a row number"))
        };
        if let Some((start, end)) = spec.split_once(':') {
            Ok(Self::Rows(number(start)?..number(end)?))
        } else if let Some((rank, parts)) = spec.split_once('/') {
            Ok(Self::Part {
                rank: number(rank)?,
                parts: number(parts)?,
            })
        } else {
            Err(format!("{spec:?} is not START:END or RANK/PARTS"))
        }
    }
}

/// Which tensors to load, and which rows of them. The default loads everything, whole.
#[derive(Clone, Default)]
pub struct Selection {
    names: Option<BTreeSet<String>>,
    predicate: Option<NamePredicate>,
    rows: Vec<RowsFor>,
    required: BTreeSet<String>,
    /// The selection as a caller wrote it, when keeping no tensor is an error.
    refuses_nothing: Option<String>,
}

impl fmt::Debug for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Selection")
            .field("names", &self.names)
            .field("predicate", &self.predicate.is_some())
            .field("row_rules", &self.rows.len())
            .field("refuses_nothing", &self.refuses_nothing)
            .finish()
    }
}

impl Selection {
    /// Every tensor, whole.
    pub fn all() -> Self {
        Self::default()
    }

    /// Exactly these tensors; a name the checkpoint does not hold is an error when the
    /// selection is applied.
    pub fn names<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            names: Some(names.into_iter().map(Into::into).collect()),
            ..Self::default()
        }
    }

    /// The tensors whose name `keep` accepts.
    pub fn matching(keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self {
            predicate: Some(Arc::new(keep)),
            ..Self::default()
        }
    }

    /// Makes a selection that keeps no tensor of the checkpoint an error
    /// ([`Error::NothingSelected`](crate::Error::NothingSelected), naming `written`: the
    /// selection as the caller wrote it) instead of an empty load. The names and globs of the
    /// `select` option ask for it in every door; a selection a program builds (a rank's share,
    /// a function's answer) may keep nothing. What is asked is whether
    /// [`matching`](Self::matching)'s predicate keeps a tensor of the files read, so a
    /// [`within`](Self::within) applied to a checkpoint already read (as a load into targets
    /// narrows to them) may keep nothing.
    pub fn refusing_nothing(mut self, written: impl Into<String>) -> Self {
        self.refuses_nothing = Some(written.into());
        self
    }

    /// Reads only `rows` of tensor `name` (it must be selected; a name the checkpoint does not
    /// hold is an error when the selection is applied).
    pub fn rows(mut self, name: impl Into<String>, rows: RowRange) -> Self {
        let name = name.into();
        self.required.insert(name.clone());
        self.rows_where(move |meta| (meta.name == name).then(|| rows.clone()))
    }

    /// Reads only the rows `rows_for` gives for each selected tensor (`None`: the whole
    /// tensor). When several rules answer for a tensor, the first one added wins.
    pub fn rows_where(
        mut self,
        rows_for: impl Fn(&TensorMeta) -> Option<RowRange> + Send + Sync + 'static,
    ) -> Self {
        self.rows.push(Arc::new(rows_for));
        self
    }

    /// Makes each of `names` an error when the checkpoint does not hold it (as [`names`](Self::names)
    /// and [`rows`](Self::rows) do), whatever else selects tensors.
    pub fn requiring<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.required.extend(names.into_iter().map(Into::into));
        self
    }

    /// Only the tensors of this selection that are also among `names` (their rows as this
    /// selection says).
    pub fn within<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: BTreeSet<String> = names.into_iter().map(Into::into).collect();
        self.names = Some(match self.names.take() {
            Some(mine) => mine.intersection(&names).cloned().collect(),
            None => names,
        });
        self
    }

    /// Whether this selection loads every tensor whole.
    pub fn is_all(&self) -> bool {
        self.names.is_none()
            && self.predicate.is_none()
            && self.rows.is_empty()
            && self.required.is_empty()
    }

    /// Whether the tensor `name` is selected, or required: what a checkpoint is opened for
    /// ([`Checkpoint::open_for_in`]).
    pub fn wants(&self, name: &str) -> bool {
        self.keeps(name) || self.required.contains(name)
    }

    fn keeps(&self, name: &str) -> bool {
        self.names.as_ref().is_none_or(|names| names.contains(name))
            && self.predicate.as_ref().is_none_or(|keep| keep(name))
    }
}

impl Checkpoint {
    /// The checkpoint narrowed to `selection`: only the selected tensors, in the same order,
    /// each cut to its rows when it has a row range. Files stay as they are (a file with no
    /// selected tensor is never opened by a load).
    pub fn select(&self, selection: &Selection) -> Result<Checkpoint> {
        if let Some(missing) = selection
            .names
            .iter()
            .flatten()
            .chain(&selection.required)
            .find(|name| self.tensor(name).is_none())
        {
            return Err(Error::UnknownTensor {
                name: missing.clone(),
            });
        }
        if let Some(written) = &selection.refuses_nothing {
            let matches = |name: &str| selection.predicate.as_ref().is_none_or(|keep| keep(name));
            if !self.tensors.iter().any(|t| matches(&t.name)) {
                return Err(Error::NothingSelected {
                    selection: written.clone(),
                });
            }
        }
        let mut tensors = Vec::new();
        for meta in self.tensors.iter().filter(|t| selection.keeps(&t.name)) {
            match selection.rows.iter().find_map(|rule| rule(meta)) {
                Some(rows) => tensors.push(narrow(meta, &rows)?),
                None => tensors.push(meta.clone()),
            }
        }
        Ok(Checkpoint::from_parts(
            self.files.clone(),
            tensors,
            self.headers_read,
        ))
    }
}

impl Checkpoint {
    /// The checkpoint narrowed to one tensor, cut to `rows` when given: what
    /// [`select`](Self::select) gives for `Selection::names([name])`, found by name instead of by
    /// a walk over every tensor (a reader asking for tensors one at a time), and holding only
    /// that tensor's file (its `file_index` 0): a read of one tensor copies one file's facts,
    /// not every file's.
    pub fn only(&self, name: &str, rows: Option<&RowRange>) -> Result<Checkpoint> {
        let meta = self.tensor(name).ok_or_else(|| Error::UnknownTensor {
            name: name.to_owned(),
        })?;
        let mut meta = match rows {
            Some(rows) => narrow(meta, rows)?,
            None => meta.clone(),
        };
        let file = self.files.get(meta.file_index).cloned().ok_or_else(|| {
            Error::Internal(format!(
                "tensor {name:?} names file {} of {}",
                meta.file_index,
                self.files.len()
            ))
        })?;
        meta.file_index = 0;
        Ok(Checkpoint::from_parts(
            vec![file],
            vec![meta],
            self.headers_read,
        ))
    }
}

/// `meta` cut to the rows `rows` means for it.
fn narrow(meta: &TensorMeta, rows: &RowRange) -> Result<TensorMeta> {
    let refuse = |reason: String| Error::Rows {
        tensor: meta.name.clone(),
        file: meta.file.to_path_buf(),
        rows: rows.to_string(),
        reason,
    };
    let Some((&dim0, rest)) = meta.shape.split_first() else {
        return Err(refuse("a scalar has no rows".into()));
    };
    let Some(range) = rows.resolve(dim0) else {
        return Err(refuse(format!("they are not inside its {dim0} rows")));
    };
    let row_bits = rest
        .iter()
        .try_fold(meta.dtype.bitsize(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| refuse("its row size overflows".into()))?;
    if row_bits % 8 != 0 {
        return Err(refuse(format!(
            "a row of {row_bits} bits ({:?}) is not a whole number of bytes",
            meta.dtype
        )));
    }
    let row_bytes = row_bits / 8;
    let (Some(skip), Some(len)) = (
        range.start.checked_mul(row_bytes),
        range.len().checked_mul(row_bytes),
    ) else {
        return Err(refuse("its byte range overflows".into()));
    };
    if skip.checked_add(len).is_none_or(|end| end > meta.len) {
        return Err(refuse(format!(
            "the rows do not lie inside its {} bytes",
            meta.len
        )));
    }
    let mut narrowed = meta.clone();
    narrowed.offset += skip as u64;
    narrowed.len = len;
    if let Some(first) = narrowed.shape.first_mut() {
        *first = range.len();
    }
    narrowed.row_range = Some(range);
    Ok(narrowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("2:5", Ok(RowRange::Rows(2..5)))]
    #[case(" 0 : 7 ", Ok(RowRange::Rows(0..7)))]
    #[case("1/4", Ok(RowRange::Part { rank: 1, parts: 4 }))]
    #[case("lots", Err(()))]
    #[case("1:x", Err(()))]
    #[case("-1:2", Err(()))]
    #[case("1/", Err(()))]
    #[case("", Err(()))]
    fn row_ranges_parse(#[case] text: &str, #[case] expected: Result<RowRange, ()>) {
        assert_eq!(text.parse::<RowRange>().map_err(|_| ()), expected);
    }

    #[rstest]
    #[case::rows(RowRange::Rows(2..5), 10, Some(2..5))]
    #[case::empty_rows(RowRange::Rows(3..3), 10, Some(3..3))]
    #[case::past_the_end(RowRange::Rows(8..11), 10, None)]
    #[case::reversed(RowRange::Rows(Range { start: 5, end: 2 }), 10, None)]
    #[case::even_parts(RowRange::Part { rank: 1, parts: 2 }, 10, Some(5..10))]
    #[case::uneven_first(RowRange::Part { rank: 0, parts: 3 }, 10, Some(0..4))]
    #[case::uneven_last(RowRange::Part { rank: 2, parts: 3 }, 10, Some(7..10))]
    #[case::more_parts_than_rows(RowRange::Part { rank: 3, parts: 4 }, 2, Some(2..2))]
    #[case::rank_out_of_range(RowRange::Part { rank: 2, parts: 2 }, 10, None)]
    #[case::no_parts(RowRange::Part { rank: 0, parts: 0 }, 10, None)]
    fn row_ranges_resolve(
        #[case] rows: RowRange,
        #[case] dim0: usize,
        #[case] expected: Option<Range<usize>>,
    ) {
        assert_eq!(rows.resolve(dim0), expected);
    }

    #[test]
    fn parts_cover_every_row_once() {
        for dim0 in 0..20 {
            for parts in 1..6 {
                let mut next = 0;
                for rank in 0..parts {
                    let r = RowRange::Part { rank, parts }.resolve(dim0).unwrap();
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, dim0);
            }
        }
    }
}
