//! Pinned bounce buffers: the POSIX path's pool (a read into one pinned half while the other is
//! copied to the device) and [`Bounced`], any host reader put in front of a GPU through them.

use super::*;

/// Two pinned halves of one bounce buffer: while one half's copy to the device runs, the next
/// read fills the other.
struct Bounce<P> {
    halves: [P; 2],
}

/// Pinned bounce buffers of one GPU, pooled: one pair per read in flight, kept for the next.
pub(crate) struct BouncePool<G: Gpu> {
    gpu: Arc<G>,
    size: usize,
    pool: Mutex<Vec<Bounce<G::Pinned>>>,
}

impl<G: Gpu> BouncePool<G> {
    pub(crate) fn new(gpu: Arc<G>, size: usize) -> Self {
        Self {
            gpu,
            size: size.max(4096),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// Reads into `dst` from `offset` with `fill` (which reads up to `buf.len()` bytes at an
    /// offset into host memory, like `pread`) through pinned memory, then a copy to the device.
    /// Reads of up to half the bounce size alternate between two pinned halves, so each half's
    /// asynchronous copy overlaps the next read; both copies have finished when this returns,
    /// whatever it returns. Bytes already on their way count: a read that fails after some
    /// progress returns that progress, and the caller's next read meets the failure at its own
    /// offset.
    pub(crate) fn read(
        &self,
        offset: u64,
        mut dst: DeviceRegion<'_, G::Space>,
        fill: impl FnMut(&mut [u8], u64) -> Result<usize, ReadError>,
    ) -> Result<usize, ReadError> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut bounce = match pooled {
            Some(b) => b,
            None => {
                let half = (self.size / 2).max(4096);
                let one = G::pinned(&self.gpu, half).map_err(device_read_error)?;
                let two = G::pinned(&self.gpu, half).map_err(device_read_error)?;
                Bounce { halves: [one, two] }
            }
        };
        let result = self.pipelined(&mut bounce, offset, &mut dst, fill);
        // Both copies finish before `dst` can be released or the halves reused.
        let [one, two] = &mut bounce.halves;
        let waited = one.wait().and_then(|()| two.wait());
        match waited {
            Ok(()) => {
                self.pool
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(bounce);
                result
            }
            // A failed wait leaves the halves' state unknown: they are dropped, not pooled.
            Err(e) => Err(device_read_error(e)),
        }
    }

    fn pipelined(
        &self,
        bounce: &mut Bounce<G::Pinned>,
        offset: u64,
        dst: &mut DeviceRegion<'_, G::Space>,
        mut fill: impl FnMut(&mut [u8], u64) -> Result<usize, ReadError>,
    ) -> Result<usize, ReadError> {
        let want = dst.len();
        let mut done = 0usize;
        let mut turn = 0usize;
        while done < want {
            let Some(half) = bounce.halves.get_mut(turn % 2) else {
                break;
            };
            let bytes = half.bytes_mut().map_err(device_read_error)?;
            let n = (want - done).min(bytes.len());
            let Some(buf) = bytes.get_mut(..n) else {
                break;
            };
            let got = match fill(buf, offset + done as u64) {
                Ok(got) => got,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            };
            if got == 0 {
                break;
            }
            let Some(target) = dst.slice(done, got) else {
                return Err(ReadError::Overrun {
                    requested: n,
                    returned: got,
                });
            };
            // SAFETY: `read` waits for both halves before it returns, and `half`'s bytes are
            // only written again through `bytes_mut`, which waits first; until then `dst`, of
            // which `target` is a part, stays mutably borrowed by this call, so its memory is
            // neither released nor touched by anyone else, and later pieces are disjoint from
            // this one.
            unsafe { self.gpu.copy_to_device(half, target) }.map_err(device_read_error)?;
            done += got;
            turn += 1;
            if got < n {
                break;
            }
        }
        Ok(done)
    }
}

/// A reader of a GPU's memory over any reader of host memory ([`GdsReader::bounced`]): each read
/// goes into pinned bounce buffers and is copied to the device, overlapped as on the POSIX path.
/// The source decides how bytes are fetched (ranged GETs from an object store, say) and how a
/// file is known to be unchanged.
pub struct Bounced<R, G: Gpu> {
    pub(crate) source: R,
    pub(crate) bounce: Arc<BouncePool<G>>,
    pub(crate) name: &'static str,
}

impl<R: std::fmt::Debug, G: Gpu> std::fmt::Debug for Bounced<R, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounced")
            .field("source", &self.source)
            .field("backend", &self.name)
            .field("bounce_size", &self.bounce.size)
            .finish()
    }
}

impl<R, G> Reader for Bounced<R, G>
where
    R: Reader<Space = HostMemory>,
    G: Gpu,
{
    type Space = G::Space;
    type File = R::File;

    fn name(&self) -> &str {
        self.name
    }

    fn mode(&self) -> IoMode {
        self.source.mode()
    }

    fn unchanged_by(&self) -> &'static str {
        self.source.unchanged_by()
    }

    fn redirects(&self) -> Vec<String> {
        self.source.redirects()
    }

    fn open(&self, path: &Path) -> Result<R::File, ReadError> {
        self.source.open(path)
    }

    fn reopen(&self, path: &Path) -> Result<R::File, ReadError> {
        self.source.reopen(path)
    }

    fn read_at(
        &self,
        file: &R::File,
        offset: u64,
        dst: DeviceRegion<'_, G::Space>,
    ) -> Result<usize, ReadError> {
        self.bounce.read(offset, dst, |buf, at| {
            self.source.read_at(file, at, DeviceRegion::from_slice(buf))
        })
    }

    fn verify_unchanged(&self, path: &Path, identity: &FileIdentity) -> Result<(), String> {
        self.source.verify_unchanged(path, identity)
    }

    fn identity_of(&self, file: &R::File) -> Option<FileIdentity> {
        self.source.identity_of(file)
    }
}
