//! What an object was when its header was read ([`Version`]), by the strongest validator its
//! server gives ([`Validator`]), and whether a later response shows another version: every
//! request of a load is conditional on that version and every response is compared with it.

use std::collections::HashMap;
use std::io;

use chrono::{DateTime, Utc};
use object_store::ObjectMeta;
use staging_core::FileIdentity;

use crate::reader::Object;
use crate::store::Inner;

/// How a load knows its objects are the versions whose headers it read (the report's
/// `unchanged_by`), weakest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Validator {
    /// The server gives ETags: every request is `If-Match`, every response's ETag compared.
    Etag,
    /// A weak ETag (`W/"..."`, which no `If-Match` can rest on: a server compares it strongly
    /// and refuses every request) and `Last-Modified`: every request is
    /// `If-Unmodified-Since`, every response's `Last-Modified` and weak ETag compared.
    WeakEtagLastModified,
    /// No ETag but `Last-Modified`: every request is `If-Unmodified-Since`, every response's
    /// `Last-Modified` compared (whole seconds).
    LastModified,
    /// A weak ETag and no `Last-Modified`: every response's size and weak ETag compared.
    WeakEtagSize,
    /// Neither: only the size is compared, so a replacement of the same size is not seen.
    Size,
}

impl Validator {
    /// Its name in reports: `etag`, `weak-etag+last-modified`, `last-modified`,
    /// `weak-etag+size`, `size`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Etag => "etag",
            Self::WeakEtagLastModified => "weak-etag+last-modified",
            Self::LastModified => "last-modified",
            Self::WeakEtagSize => "weak-etag+size",
            Self::Size => "size",
        }
    }
}

/// What a file was when its header was read: the version every later request is conditional on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    pub(crate) size: u64,
    /// A strong ETag: the one validator that names the bytes.
    pub(crate) etag: Option<String>,
    /// A weak ETag (`W/"..."`): no condition can rest on it (RFC 9110 compares `If-Match`
    /// strongly, so a weak tag never matches and a conditional request always fails), but a
    /// response whose weak tag differs is another version all the same.
    pub(crate) weak_etag: Option<String>,
    /// `None` when the server sent no `Last-Modified` (object_store then says the epoch).
    pub(crate) last_modified: Option<DateTime<Utc>>,
}

impl Version {
    pub(crate) fn of(meta: &ObjectMeta) -> Self {
        let (weak_etag, etag) = match &meta.e_tag {
            Some(tag) if tag.starts_with("W/") => (Some(tag.clone()), None),
            tag => (None, tag.clone()),
        };
        Self {
            size: meta.size,
            etag,
            weak_etag,
            last_modified: (meta.last_modified != DateTime::<Utc>::UNIX_EPOCH)
                .then_some(meta.last_modified),
        }
    }

    pub(crate) fn validator(&self) -> Validator {
        match (&self.etag, self.weak_etag.is_some(), &self.last_modified) {
            (Some(_), ..) => Validator::Etag,
            (None, true, Some(_)) => Validator::WeakEtagLastModified,
            (None, false, Some(_)) => Validator::LastModified,
            (None, true, None) => Validator::WeakEtagSize,
            (None, false, None) => Validator::Size,
        }
    }

    /// The version as the core's file identity: no device, the ETag's hash for the inode, the
    /// size, and the modification time.
    pub(crate) fn identity(&self) -> FileIdentity {
        // FNV-1a of the ETag: equal ETags give equal identities.
        let ino = self
            .etag
            .as_deref()
            .or(self.weak_etag.as_deref())
            .unwrap_or("")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let modified = self.last_modified.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        FileIdentity {
            dev: 0,
            ino,
            size: self.size,
            mtime: modified.timestamp(),
            mtime_nsec: i64::from(modified.timestamp_subsec_nanos()),
        }
    }

    /// How `now` (what a response says) differs from this version, by its size and this
    /// version's validator; `None` when it is the same version as far as they tell.
    pub(crate) fn differs(&self, now: &Version) -> Option<String> {
        if now.size != self.size {
            return Some(format!("it is now {} bytes", now.size));
        }
        if let Some(was) = &self.weak_etag {
            match (&now.weak_etag, &now.etag) {
                (Some(is), _) | (None, Some(is)) if is != was => {
                    return Some(format!("it is now ETag {is}"));
                }
                _ => {}
            }
        }
        let by_date = matches!(
            self.validator(),
            Validator::LastModified | Validator::WeakEtagLastModified
        );
        match (self.validator(), &now.etag, &now.last_modified) {
            (Validator::Etag, Some(etag), _) if Some(etag) != self.etag.as_ref() => {
                Some(format!("it is now ETag {etag}"))
            }
            (Validator::Etag, None, _) => Some("a response carried no ETag".to_owned()),
            (_, _, Some(date)) if by_date && Some(date) != self.last_modified.as_ref() => {
                Some(format!("it is now Last-Modified {}", date.to_rfc2822()))
            }
            (_, _, None) if by_date => Some("a response carried no Last-Modified".to_owned()),
            _ => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match (&self.etag, &self.last_modified) {
            (Some(etag), _) => format!("ETag {etag}"),
            (None, _) if self.weak_etag.is_some() => {
                let by = match &self.last_modified {
                    Some(date) => format!("Last-Modified {}", date.to_rfc2822()),
                    None => format!("{} bytes", self.size),
                };
                format!("{by} (its ETag is weak)")
            }
            (None, Some(date)) => format!("Last-Modified {}", date.to_rfc2822()),
            (None, None) => format!("{} bytes", self.size),
        }
    }
}

/// An object's version as its header was read, and the first difference any response showed.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub(crate) version: Version,
    pub(crate) changed: Option<String>,
}

impl Inner {
    pub(crate) fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Tracked>>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `version` as the latest of `url` (the one reads opened from now on are
    /// conditional on); a version seen before keeps what was noted of it.
    pub(crate) fn record(&self, url: &str, version: &Version) {
        let mut versions = self.versions();
        let seen = versions.entry(url.to_owned()).or_default();
        let tracked = match seen.iter().position(|t| t.version == *version) {
            Some(i) => seen.remove(i),
            None => Tracked {
                version: version.clone(),
                changed: None,
            },
        };
        seen.push(tracked);
    }

    /// The latest version of `url` recorded.
    pub(crate) fn recorded(&self, url: &str) -> Option<Version> {
        let versions = self.versions();
        versions
            .get(url)
            .and_then(|seen| seen.last())
            .map(|t| t.version.clone())
    }

    /// Notes that a response showed `object` changed (kept, so that the tensor being read is
    /// not handed out even if the error that came with it was not the one reported), and
    /// returns the error.
    pub(crate) fn changed(&self, object: &Object, detail: &str) -> io::Error {
        let mut versions = self.versions();
        if let Some(tracked) = versions
            .get_mut(&object.url)
            .and_then(|seen| seen.iter_mut().find(|t| t.version == object.version))
        {
            tracked.changed.get_or_insert_with(|| detail.to_owned());
        }
        object.changed(detail)
    }

    /// The weakest validator of the objects opened so far.
    pub(crate) fn validator(&self) -> Option<Validator> {
        self.versions()
            .values()
            .flatten()
            .map(|t| t.version.validator())
            .max()
    }
}
