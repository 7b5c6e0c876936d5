//! The [`RemoteReader`]: the core's reader of a [`Remote`](crate::Remote)'s objects into host
//! memory.

use std::io;
use std::path::Path;
use std::sync::Arc;

use staging_core::{DeviceRegion, FileIdentity, HostMemory, IoMode, ReadError, Reader};

use crate::inner::{Inner, Stats};
use crate::version::{Object, Tracked, Validator, Version};

impl Inner {
    /// Opens `path`: its version as recorded when its header was read, else as it is now.
    fn object(&self, path: &Path) -> io::Result<Object> {
        let key = self.key(path)?;
        let url = self.root.url_of(&key);
        let version = match self.recorded(&url) {
            Some(version) => version,
            None => {
                let version = Version::of(&self.head(&key)?);
                self.record(&url, &version);
                version
            }
        };
        Ok(Object { key, url, version })
    }
}

/// Reads a [`Remote`](crate::Remote)'s objects into host memory
/// ([`Remote::reader`](crate::Remote::reader)).
#[derive(Debug, Clone)]
pub struct RemoteReader {
    pub(crate) inner: Arc<Inner>,
}

impl RemoteReader {
    /// What was asked for and received so far.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Fills `dst` with `file`'s bytes from `offset` (all of them, or an error).
    pub fn read_into(&self, file: &Object, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        self.inner.block_on(self.inner.fetch(file, offset, dst))?;
        self.inner.settle(file)
    }
}

impl Reader for RemoteReader {
    type Space = HostMemory;
    type File = Object;

    fn name(&self) -> &str {
        "host"
    }

    fn mode(&self) -> IoMode {
        IoMode::Remote
    }

    fn open(&self, path: &Path) -> Result<Object, ReadError> {
        Ok(self.inner.object(path)?)
    }

    fn read_at(
        &self,
        file: &Object,
        offset: u64,
        mut dst: DeviceRegion<'_, HostMemory>,
    ) -> Result<usize, ReadError> {
        let size = file.version.size;
        if offset >= size {
            return Ok(0);
        }
        let available = usize::try_from(size - offset).unwrap_or(usize::MAX);
        let len = dst.len().min(available);
        let slice = dst.as_mut_slice();
        let Some(target) = slice.get_mut(..len) else {
            return Ok(0);
        };
        self.read_into(file, offset, target)?;
        Ok(len)
    }

    fn unchanged_by(&self) -> &'static str {
        self.inner.validator().unwrap_or(Validator::Etag).as_str()
    }

    fn redirects(&self) -> Vec<String> {
        self.inner.redirects.followed()
    }

    fn verify_unchanged(&self, path: &Path, identity: &FileIdentity) -> Result<(), String> {
        // Every read was conditional on the recorded version and every response was compared
        // with it. Left to check: that no response since showed another version (its error may
        // not be the one reported: a pipelined read stops at its first failure), and that the
        // recorded version is the one whose header was read (a header read through another
        // `Remote`, as the Python door's metadata is, has its own record).
        let url = self
            .inner
            .key(path)
            .map(|key| self.inner.root.url_of(&key))
            .map_err(|e| e.to_string())?;
        // The latest version is the one a file opened now reads (`Inner::object`): the header
        // must be of that one.
        let versions = self.inner.versions();
        match versions.get(&url).and_then(|seen| seen.last()) {
            None => Err("was never opened".to_owned()),
            Some(Tracked { version, .. }) if version.identity() != *identity => Err(format!(
                "was replaced since its header was read (it is now {})",
                version.describe()
            )),
            Some(Tracked {
                changed: Some(detail),
                version,
            }) => Err(format!(
                "changed during the load (it was read at {}): {detail}",
                version.describe()
            )),
            Some(_) => Ok(()),
        }
    }
}
