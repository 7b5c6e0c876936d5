//! Reading an object's bytes: ranged `GET`s, as many at once as the store's permits allow,
//! each conditional on the version the header was read at and checked against it, streamed into
//! the destination under the bandwidth cap; a body cut short without an ETag to resume under is
//! asked for again.

use std::io;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};

use crate::errors::{describe, kind_of};
use crate::inner::Inner;
use crate::retry::{Attempt, RetryContext};
use crate::version::{Object, Version};

impl Inner {
    /// Fills `dst` with `object`'s bytes from `offset`: ranges of `range_size`, fetched
    /// concurrently within the store's request limit. All or an error.
    pub(crate) async fn fetch(
        &self,
        object: &Object,
        offset: u64,
        dst: &mut [u8],
    ) -> io::Result<()> {
        let ranges = dst
            .chunks_mut(self.range_size)
            .scan(offset, |at, piece| {
                let start = *at;
                *at += piece.len() as u64;
                Some(self.fetch_range(object, start, piece))
            })
            .collect::<Vec<_>>();
        futures::future::try_join_all(ranges).await.map(|_| ())
    }

    /// `error` from a request for `object`, or that the object changed, when it did (a server
    /// without ETags answers a read past a shrunk object with 416, say).
    async fn diagnose(&self, object: &Object, error: io::Error) -> io::Error {
        self.heads.fetch_add(1, Ordering::Relaxed);
        match self.store.head(&object.key).await {
            Ok(meta) => match object.version.differs(&Version::of(&meta)) {
                Some(detail) => self.changed(object, &detail),
                None => error,
            },
            Err(_) => error,
        }
    }

    /// One ranged `GET`, conditional on `object`'s version, streamed into `dst`. Without an
    /// ETag a body cut short is not resumed: the whole range is asked for again, at most
    /// as often as the retry policy allows, after its waits (with an ETag object_store resumes
    /// it, conditional on the ETag). The retry loop is the crate's one ([`RetryContext::run`]).
    async fn fetch_range(&self, object: &Object, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let mut context = RetryContext::new(&self.retry);
        let tries = context.run(dst, |dst: &mut [u8]| async move {
            let attempt = match self.fetch_range_once(object, offset, dst).await {
                Ok(()) => Attempt::Done(()),
                Err(Failure::Body(e)) if object.version.etag.is_none() => Attempt::Transient(e),
                Err(Failure::Body(e) | Failure::Request(e)) => Attempt::Permanent(e),
            };
            (dst, attempt)
        });
        tries.await.1.map_err(|e| e.error)
    }

    async fn fetch_range_once(
        &self,
        object: &Object,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Failure> {
        let end = offset + dst.len() as u64;
        let url = &object.url;
        let at = |what: String| format!("GET {url} bytes {offset}..{end}: {what}");
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| Failure::Request(io::Error::other(at(e.to_string()))))?;
        self.gets.fetch_add(1, Ordering::Relaxed);
        let version = &object.version;
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: version.etag.clone(),
            // Only without an ETag: If-Match is the stronger condition, and a server evaluates
            // If-Unmodified-Since only when If-Match is absent.
            if_unmodified_since: version.last_modified.filter(|_| version.etag.is_none()),
            ..GetOptions::default()
        };
        let result = match self.store.get_opts(&object.key, options).await {
            Ok(result) => result,
            Err(e @ object_store::Error::Precondition { .. }) => {
                return Err(Failure::Request(self.changed(object, &describe(&e))));
            }
            Err(e) => {
                let error = io::Error::new(kind_of(&e), at(describe(&e)));
                return Err(Failure::Request(self.diagnose(object, error).await));
            }
        };
        // Every response is checked: a server may ignore the condition.
        if let Some(detail) = version.differs(&Version::of(&result.meta)) {
            return Err(Failure::Request(self.changed(object, &detail)));
        }
        if result.range != (offset..end) {
            return Err(Failure::Request(io::Error::new(
                io::ErrorKind::InvalidData,
                at(format!("the server sent bytes {:?}", result.range)),
            )));
        }
        let mut body = result.into_stream();
        let mut filled = 0usize;
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| Failure::Body(io::Error::new(kind_of(&e), at(describe(&e)))))?;
            if let Some(pace) = &self.pace {
                pace.take(chunk.len()).await;
            }
            let Some(target) = dst.get_mut(filled..filled + chunk.len()) else {
                return Err(Failure::Request(io::Error::new(
                    io::ErrorKind::InvalidData,
                    at("the body is longer than the range".to_owned()),
                )));
            };
            target.copy_from_slice(&chunk);
            filled += chunk.len();
            self.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        if filled != dst.len() {
            return Err(Failure::Body(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                at(format!("the body ended after {filled} bytes")),
            )));
        }
        // Where a caller asked: the bytes go there too (the Hugging Face cache).
        if let Some(tee) = self.tee.get() {
            tee.received(object.key.as_ref(), offset, dst)
                .map_err(Failure::Request)?;
        }
        Ok(())
    }

    /// After a read of `object`: where a caller asked, the object may now be complete there
    /// (the Hugging Face cache commits a file once it is whole and its SHA-256 is right, or
    /// fails naming it).
    pub(crate) fn settle(&self, object: &Object) -> io::Result<()> {
        match self.tee.get() {
            Some(tee) => tee.settle(object.key.as_ref()),
            None => Ok(()),
        }
    }
}

/// Why one ranged `GET` failed: the request (not retried here: object_store already did what
/// can be done), or the body after a good answer (cut short: the whole range may be asked for
/// again when there is no ETag to resume under).
enum Failure {
    Request(io::Error),
    Body(io::Error),
}
