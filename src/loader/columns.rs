//! Some columns of a tensor ([`read_columns`]): one run per row of dimension 0 copied out of
//! the mapping of its file, only those runs made resident.

use std::time::Instant;

use staging_core::{Checkpoint, HostBytes, HostTensor, LoadReport, StagingPath, TensorMeta};

use super::mapped::{MapCache, RUN_BY_RUN_GAP, mapped_report, offset_in, populate_failed};
use crate::mapping::{Descriptors, MappedBytes, Mapping, READ_AHEAD, still_unchanged};
use crate::tensor::{Data, Tensor};

/// Columns `columns` (a range of dimension 1) of every row of the one tensor of `checkpoint`,
/// copied out of the mapping of its file into host memory of their own: one run per row of
/// dimension 0, and only those runs read (made resident where the page cache does not hold
/// them). The report counts the bytes returned as the bytes read.
///
/// `Ok(None)` when the system has no memory for the mapping, or when the tensor's rows are not
/// runs of whole bytes (fewer than two dimensions, sub-byte elements): the caller reads whole
/// rows instead.
pub(super) fn read_columns(
    checkpoint: &Checkpoint,
    cache: Option<&MapCache>,
    columns: std::ops::Range<usize>,
) -> staging_core::Result<Option<(Tensor, LoadReport)>> {
    let started = Instant::now();
    let [meta] = checkpoint.tensors() else {
        return Err(staging_core::Error::Internal(format!(
            "a read of columns is of one tensor, not {}",
            checkpoint.tensors().len()
        )));
    };
    let Some(geometry) = RunGeometry::of(meta, &columns)? else {
        return Ok(None);
    };
    let shard = checkpoint.files().get(meta.file_index).ok_or_else(|| {
        staging_core::Error::Internal(format!("tensor {:?} names no file", meta.name))
    })?;
    let own;
    let (mapped, descriptors) = match cache {
        Some(cache) => (cache.get_or_map(shard)?, &*cache.descriptors),
        None => {
            own = Descriptors::new(1);
            (Mapping::open(shard, &own)?, &own)
        }
    };
    let Some(mapping) = mapped else {
        return Ok(None);
    };
    let offset = offset_in(meta, mapping.len())?;
    // Checked before a page is touched, as `populate_checked` does; `None`: renamed over, the
    // mapping serves the file it mapped.
    let file = descriptors.get_or_open(shard)?;
    if let Some(file) = &file {
        still_unchanged(shard, file)?;
    }
    let file = file.as_deref();
    let RunGeometry {
        rows,
        row_bytes,
        skip,
        run,
    } = geometry;
    let populated = if rows == 0 || run == 0 {
        Ok(())
    } else if row_bytes - run >= RUN_BY_RUN_GAP {
        (0..rows).try_for_each(|r| mapping.populate(file, offset + r * row_bytes + skip, run, 0))
    } else {
        mapping.populate(
            file,
            offset + skip,
            (rows - 1) * row_bytes + run,
            READ_AHEAD,
        )
    };
    populated.map_err(|error| populate_failed(shard, meta, file, error))?;
    let len = rows * run;
    let mut bytes =
        HostBytes::zeroed_present(len, 64).ok_or_else(|| staging_core::Error::HostAllocation {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            bytes: len,
        })?;
    if len > 0 {
        let source = MappedBytes::new(mapping, offset, meta.len);
        for (r, out) in bytes[..].chunks_exact_mut(run).enumerate() {
            let from = r * row_bytes + skip;
            out.copy_from_slice(&source[from..from + run]);
        }
    }
    if let Some(file) = file {
        still_unchanged(shard, file)?;
    }
    let mut narrowed = meta.clone();
    narrowed.shape[1] = columns.len();
    narrowed.offset = meta.offset + skip as u64;
    narrowed.len = len;
    let mut report = mapped_report(checkpoint);
    report.tensors = 1;
    report.bytes = len as u64;
    report.paths.add(StagingPath::Host, len as u64);
    report.peak_host_bytes = len as u64;
    if len > 0 {
        report.read_requests = 1;
        report.bytes_read = len as u64;
    }
    report.seconds = started.elapsed().as_secs_f64();
    if report.seconds > 0.0 {
        report.bytes_per_second = report.bytes as f64 / report.seconds;
    }
    let tensor = Tensor {
        meta: Box::new(narrowed),
        data: Data::Host(HostTensor::uncounted(bytes)),
        fallback: None,
    };
    Ok(Some((tensor, report)))
}

/// The runs a read of columns takes, in bytes: one per row of dimension 0.
#[derive(Debug, PartialEq, Eq)]
struct RunGeometry {
    /// Rows of dimension 0.
    rows: usize,
    /// Bytes of one row.
    row_bytes: usize,
    /// Bytes of a row before its run.
    skip: usize,
    /// Bytes of a run.
    run: usize,
}

impl RunGeometry {
    /// The runs of columns `columns` of `meta`; `None` when its rows are not runs of whole
    /// bytes. An error when the columns are not within dimension 1.
    fn of(
        meta: &TensorMeta,
        columns: &std::ops::Range<usize>,
    ) -> staging_core::Result<Option<Self>> {
        let [rows, width, rest @ ..] = meta.shape.as_slice() else {
            return Ok(None);
        };
        if columns.start > columns.end || columns.end > *width {
            return Err(staging_core::Error::Internal(format!(
                "columns {}..{} of tensor {:?}, whose dimension 1 has {width}",
                columns.start, columns.end, meta.name
            )));
        }
        let bits = rest
            .iter()
            .try_fold(meta.dtype.bitsize(), |acc, &d| acc.checked_mul(d));
        let Some(column_bytes) = bits.filter(|b| b % 8 == 0).map(|b| b / 8) else {
            return Ok(None);
        };
        let (Some(row_bytes), Some(skip), Some(run)) = (
            width.checked_mul(column_bytes),
            columns.start.checked_mul(column_bytes),
            columns.len().checked_mul(column_bytes),
        ) else {
            return Ok(None);
        };
        if rows.checked_mul(row_bytes) != Some(meta.len) {
            return Err(staging_core::Error::Internal(format!(
                "tensor {:?} of shape {:?} has {} bytes",
                meta.name, meta.shape, meta.len
            )));
        }
        Ok(Some(Self {
            rows: *rows,
            row_bytes,
            skip,
            run,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code asserts by panicking

    use std::ops::Range;

    use staging_core::Dtype;

    use super::RunGeometry;

    use crate::loader::test_support::meta;

    #[test]
    fn runs_are_the_columns_of_each_row_in_bytes() {
        let g = RunGeometry::of(&meta(Dtype::F16, &[4, 8, 3]), &(2..5)).unwrap();
        assert_eq!(
            g,
            Some(RunGeometry {
                rows: 4,
                row_bytes: 48,
                skip: 12,
                run: 18
            })
        );
        // One dimension, or sub-byte columns: no runs (the caller reads rows).
        assert_eq!(
            RunGeometry::of(&meta(Dtype::F16, &[8]), &(0..1)).unwrap(),
            None
        );
        assert_eq!(
            RunGeometry::of(&meta(Dtype::F4, &[4, 3]), &(0..1)).unwrap(),
            None
        );
        // Columns past dimension 1 are refused, not read.
        assert!(RunGeometry::of(&meta(Dtype::F16, &[4, 8]), &(6..9)).is_err());
        assert!(RunGeometry::of(&meta(Dtype::F16, &[4, 8]), &Range { start: 5, end: 2 }).is_err());
    }
}
