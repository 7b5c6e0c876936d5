//! The chunked write loop: one loop serves every path.
//!
//! It copies `[file_offset, file_offset + len)` into a region in chunks of at most `chunk_size`,
//! the last one shorter. Chunk boundaries after the first fall on 4 KiB file offsets when the
//! chunk size is a multiple of 4 KiB (GDS and O_DIRECT want that). A short read continues where it
//! stopped; zero bytes before the end is a truncated file. This module never reports success for a
//! region it did not fill completely.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::checkpoint::TensorMeta;
use crate::error::{Error, ReadError, Result};
use crate::memory::DeviceRegion;
use crate::traits::Reader;

/// File alignment that chunk boundaries keep where they can.
pub const FILE_ALIGNMENT: u64 = 4096;

/// The chunks of one byte range: `(offset relative to the range, length)` pairs, in order.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    pos: usize,
    len: usize,
    next_len: usize,
    chunk: usize,
}

/// Plans the chunks of `len` bytes starting at `file_offset`, each at most `chunk_size` (which
/// must be at least 1).
pub fn plan_chunks(file_offset: u64, len: usize, chunk_size: usize) -> ChunkPlan {
    let chunk = chunk_size.max(1);
    let misalignment = (file_offset % FILE_ALIGNMENT) as usize;
    let first = if (chunk as u64).is_multiple_of(FILE_ALIGNMENT) && misalignment != 0 {
        chunk - misalignment
    } else {
        chunk
    };
    ChunkPlan {
        pos: 0,
        len,
        next_len: first,
        chunk,
    }
}

impl Iterator for ChunkPlan {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if self.pos >= self.len {
            return None;
        }
        let n = self.next_len.min(self.len - self.pos);
        let item = (self.pos, n);
        self.pos += n;
        self.next_len = self.chunk;
        Some(item)
    }
}

/// The tensor of `tensors` (neighbours in one file, in offset order) whose bytes hold
/// `offset`: the one an error at that offset names.
pub(crate) fn tensor_at(tensors: &[TensorMeta], offset: u64) -> Option<&TensorMeta> {
    tensors
        .iter()
        .rev()
        .find(|t| t.offset <= offset)
        .or(tensors.first())
}

/// Reads exactly `dst.len()` bytes at `file_offset` into `dst`, continuing after short reads.
/// `tensors` are the tensors (one, or a run of neighbours) the bytes belong to; an error names
/// the one holding the failing offset.
pub(crate) fn read_exact<R: Reader>(
    reader: &R,
    file: &R::File,
    tensors: &[TensorMeta],
    file_offset: u64,
    mut dst: DeviceRegion<'_, R::Space>,
) -> Result<()> {
    let len = dst.len();
    let mut done = 0usize;
    while done < len {
        let at = file_offset + done as u64;
        let remaining = len - done;
        let Some(tensor) = tensor_at(tensors, at) else {
            return Err(Error::Internal("a read for no tensor".into()));
        };
        let read_error = |source| Error::Read {
            tensor: tensor.name.clone(),
            file: tensor.file.to_path_buf(),
            offset: at,
            source,
        };
        let Some(rest) = dst.slice(done, remaining) else {
            return Err(read_error(ReadError::Overrun {
                requested: remaining,
                returned: done,
            }));
        };
        match reader.read_at(file, at, rest) {
            Ok(0) => {
                return Err(Error::Truncated {
                    tensor: tensor.name.clone(),
                    file: tensor.file.to_path_buf(),
                    offset: at,
                    missing: remaining as u64,
                });
            }
            Ok(n) if n > remaining => {
                return Err(read_error(ReadError::Overrun {
                    requested: remaining,
                    returned: n,
                }));
            }
            Ok(n) => done += n,
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
    Ok(())
}

/// Fills all of `dst` with the tensor's bytes, chunk by chunk, in order; the first failure
/// stops all reading.
pub(crate) fn fill_region<R: Reader>(
    reader: &R,
    file: &R::File,
    tensor: &TensorMeta,
    mut dst: DeviceRegion<'_, R::Space>,
    chunk_size: usize,
) -> Result<()> {
    for (offset, len) in plan_chunks(tensor.offset, dst.len(), chunk_size) {
        let Some(piece) = dst.slice(offset, len) else {
            return Err(split_error(tensor, offset));
        };
        read_exact(
            reader,
            file,
            std::slice::from_ref(tensor),
            tensor.offset + offset as u64,
            piece,
        )?;
    }
    Ok(())
}

/// Reads several items of one file at once: every chunk of every `(tensors, region)` item (one
/// tensor, or a run of neighbouring tensors read as one range from the first one's offset)
/// becomes a task on `pool`. Returns the failure of the lowest-numbered failing item (at its
/// lowest failing offset), or `None` when every region is filled.
///
/// Every item numbered below the returned one is complete: a task is skipped only when an item
/// numbered *lower than its own* has already failed.
pub(crate) fn fill_regions<R: Reader>(
    pool: &rayon::ThreadPool,
    reader: &R,
    file: &R::File,
    items: Vec<(&[TensorMeta], DeviceRegion<'_, R::Space>)>,
    chunk_size: usize,
) -> Option<(usize, Error)> {
    let mut jobs = Vec::new();
    for (index, (tensors, region)) in items.into_iter().enumerate() {
        let Some(first) = tensors.first() else {
            return Some((index, Error::Internal("a read for no tensor".into())));
        };
        let mut rest = region;
        for (offset, len) in plan_chunks(first.offset, rest.len(), chunk_size) {
            let Some((head, tail)) = rest.split_at(len) else {
                return Some((index, split_error(first, offset)));
            };
            jobs.push((index, tensors, first.offset + offset as u64, head));
            rest = tail;
        }
    }
    let lowest_failed = AtomicUsize::new(usize::MAX);
    let errors = Mutex::new(Vec::new());
    pool.scope(|scope| {
        for (index, tensors, at, piece) in jobs {
            let (lowest_failed, errors) = (&lowest_failed, &errors);
            scope.spawn(move |_| {
                if index >= lowest_failed.load(Ordering::Acquire) {
                    return;
                }
                if let Err(e) = read_exact(reader, file, tensors, at, piece) {
                    lowest_failed.fetch_min(index, Ordering::AcqRel);
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((index, e));
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    errors
        .into_iter()
        .min_by_key(|(index, e)| (*index, error_offset(e)))
}

fn split_error(tensor: &TensorMeta, offset: usize) -> Error {
    Error::Read {
        tensor: tensor.name.clone(),
        file: tensor.file.to_path_buf(),
        offset: tensor.offset + offset as u64,
        source: ReadError::Overrun {
            requested: tensor.len,
            returned: offset,
        },
    }
}

/// The file offset an error names, for picking the first of several failures.
pub(crate) fn error_offset(error: &Error) -> u64 {
    match error {
        Error::Read { offset, .. }
        | Error::Truncated { offset, .. }
        | Error::Device { offset, .. } => *offset,
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn collect(offset: u64, len: usize, chunk: usize) -> Vec<(usize, usize)> {
        plan_chunks(offset, len, chunk).collect()
    }

    #[rstest]
    #[case::below_one_chunk(0, 100, 4096, vec![(0, 100)])]
    #[case::exactly_one_chunk(0, 4096, 4096, vec![(0, 4096)])]
    #[case::one_byte_over(0, 4097, 4096, vec![(0, 4096), (4096, 1)])]
    #[case::zero_length(0, 0, 4096, vec![])]
    #[case::misaligned_start_realigns(4000, 10000, 8192, vec![(0, 4192), (4192, 5808)])]
    #[case::unaligned_chunk_size_is_kept(10, 25, 10, vec![(0, 10), (10, 10), (20, 5)])]
    fn chunk_plans(
        #[case] offset: u64,
        #[case] len: usize,
        #[case] chunk: usize,
        #[case] expected: Vec<(usize, usize)>,
    ) {
        let plan = collect(offset, len, chunk);
        assert_eq!(plan, expected);
        assert_eq!(plan.iter().map(|c| c.1).sum::<usize>(), len);
        // Every chunk after the first starts on a 4 KiB file offset when the chunk size allows.
        if chunk.is_multiple_of(4096) {
            for &(rel, _) in plan.iter().skip(1) {
                assert_eq!((offset + rel as u64) % 4096, 0);
            }
        }
    }
}
