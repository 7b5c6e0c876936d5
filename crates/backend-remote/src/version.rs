//! What an object was when its header was read ([`Version`]), by the strongest validator its
//! server gives ([`Validator`]), and whether a later response shows another version: every
//! request of a load is conditional on that version and every response is compared with it.
//! An [`Object`] is opened at one.

use std::io;

use chrono::{DateTime, Utc};
use object_store::ObjectMeta;
use staging_core::FileIdentity;

use object_store::path::Path as Key;

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

/// An object opened for reading, at the version its reads are conditional on.
#[derive(Debug)]
pub struct Object {
    pub(crate) key: Key,
    pub(crate) url: String,
    pub(crate) version: Version,
}

impl Object {
    pub(crate) fn changed(&self, detail: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} changed during the load (it was read at {}): {detail}",
                self.url,
                self.version.describe()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use chrono::TimeZone;

    use super::*;
    use crate::{Options, Remote};

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(seconds, 0).single().unwrap_or_default()
    }

    /// What a response (or a `HEAD`) says, as object_store gives it: no `Last-Modified` is
    /// the epoch.
    fn meta(size: u64, e_tag: Option<&str>, last_modified: Option<i64>) -> ObjectMeta {
        ObjectMeta {
            location: "model.safetensors".into(),
            last_modified: last_modified.map_or(DateTime::<Utc>::UNIX_EPOCH, at),
            size,
            e_tag: e_tag.map(str::to_owned),
            version: None,
        }
    }

    fn version(size: u64, e_tag: Option<&str>, last_modified: Option<i64>) -> Version {
        Version::of(&meta(size, e_tag, last_modified))
    }

    #[test]
    fn the_strongest_validator_a_server_gives_is_the_one_used() {
        let cases = [
            (Some("\"a\""), Some(1_700_000_000), Validator::Etag, "etag"),
            (Some("\"a\""), None, Validator::Etag, "etag"),
            (
                Some("W/\"a\""),
                Some(1_700_000_000),
                Validator::WeakEtagLastModified,
                "weak-etag+last-modified",
            ),
            (
                None,
                Some(1_700_000_000),
                Validator::LastModified,
                "last-modified",
            ),
            (
                Some("W/\"a\""),
                None,
                Validator::WeakEtagSize,
                "weak-etag+size",
            ),
            (None, None, Validator::Size, "size"),
        ];
        for (e_tag, modified, validator, name) in cases {
            let v = version(10, e_tag, modified);
            assert_eq!(v.validator(), validator, "{e_tag:?} {modified:?}");
            assert_eq!(v.validator().as_str(), name);
        }
        // A weak tag is never a condition (`If-Match` would always fail), only compared.
        let weak = version(10, Some("W/\"a\""), None);
        assert_eq!(weak.etag, None);
        assert_eq!(weak.weak_etag.as_deref(), Some("W/\"a\""));
        // The epoch is object_store's word for "no Last-Modified".
        assert_eq!(version(10, None, Some(0)).last_modified, None);
        assert_eq!(version(10, None, Some(1)).last_modified, Some(at(1)));
        // Weakest last: a load reports the weakest of its objects' validators.
        assert!(Validator::Etag < Validator::WeakEtagLastModified);
        assert!(Validator::WeakEtagLastModified < Validator::LastModified);
        assert!(Validator::LastModified < Validator::WeakEtagSize);
        assert!(Validator::WeakEtagSize < Validator::Size);
    }

    #[test]
    fn a_strong_etag_tells_every_change_by_itself() {
        let was = version(10, Some("\"a\""), Some(100));
        assert_eq!(was.differs(&version(10, Some("\"a\""), Some(100))), None);
        // The ETag names the bytes: a new date on the same tag is the same version.
        assert_eq!(was.differs(&version(10, Some("\"a\""), Some(200))), None);
        assert_eq!(
            was.differs(&version(10, Some("\"b\""), Some(100)))
                .as_deref(),
            Some("it is now ETag \"b\"")
        );
        for modified in [Some(100), None] {
            assert_eq!(
                was.differs(&version(10, None, modified)).as_deref(),
                Some("a response carried no ETag"),
                "{modified:?}"
            );
        }
        // Turning weak is losing the strong tag.
        assert_eq!(
            was.differs(&version(10, Some("W/\"a\""), Some(100)))
                .as_deref(),
            Some("a response carried no ETag")
        );
        assert_eq!(
            was.differs(&version(11, Some("\"a\""), Some(100)))
                .as_deref(),
            Some("it is now 11 bytes")
        );
    }

    #[test]
    fn a_weak_etag_with_last_modified_is_compared_by_both() {
        let was = version(10, Some("W/\"a\""), Some(100));
        assert_eq!(was.differs(&version(10, Some("W/\"a\""), Some(100))), None);
        assert_eq!(
            was.differs(&version(10, Some("W/\"b\""), Some(100)))
                .as_deref(),
            Some("it is now ETag W/\"b\"")
        );
        let later = was.differs(&version(10, Some("W/\"a\""), Some(200)));
        assert_eq!(
            later,
            Some(format!("it is now Last-Modified {}", at(200).to_rfc2822()))
        );
        assert_eq!(
            was.differs(&version(10, Some("W/\"a\""), None)).as_deref(),
            Some("a response carried no Last-Modified")
        );
        assert_eq!(
            was.differs(&version(9, Some("W/\"a\""), Some(100)))
                .as_deref(),
            Some("it is now 9 bytes")
        );
        assert_eq!(
            was.describe(),
            format!("Last-Modified {} (its ETag is weak)", at(100).to_rfc2822())
        );
    }

    #[test]
    fn a_weak_etag_without_last_modified_is_compared_with_the_size() {
        let was = version(10, Some("W/\"a\""), None);
        assert_eq!(was.differs(&version(10, Some("W/\"a\""), None)), None);
        // A date appearing says nothing about the bytes: the tag and the size do.
        assert_eq!(was.differs(&version(10, Some("W/\"a\""), Some(100))), None);
        assert_eq!(
            was.differs(&version(10, Some("W/\"b\""), None)).as_deref(),
            Some("it is now ETag W/\"b\"")
        );
        assert_eq!(
            was.differs(&version(12, Some("W/\"a\""), None)).as_deref(),
            Some("it is now 12 bytes")
        );
        assert_eq!(was.describe(), "10 bytes (its ETag is weak)");
    }

    #[test]
    fn a_weak_etag_turning_strong_is_a_change() {
        for modified in [Some(100), None] {
            let was = version(10, Some("W/\"a\""), modified);
            assert_eq!(
                was.differs(&version(10, Some("\"a\""), modified))
                    .as_deref(),
                Some("it is now ETag \"a\""),
                "{modified:?}"
            );
        }
    }

    #[test]
    fn last_modified_alone_is_compared_to_the_second() {
        let was = version(10, None, Some(100));
        assert_eq!(was.differs(&version(10, None, Some(100))), None);
        assert!(was.differs(&version(10, None, Some(101))).is_some());
        assert_eq!(
            was.differs(&version(10, None, None)).as_deref(),
            Some("a response carried no Last-Modified")
        );
        assert_eq!(
            was.describe(),
            format!("Last-Modified {}", at(100).to_rfc2822())
        );
    }

    #[test]
    fn without_any_validator_only_the_size_tells() {
        let was = version(10, None, None);
        assert_eq!(was.validator(), Validator::Size);
        assert_eq!(was.differs(&version(10, None, None)), None);
        // A replacement of the same size is not seen: what the report's `size` owns up to.
        assert_eq!(was.differs(&version(10, Some("\"b\""), Some(100))), None);
        assert_eq!(was.differs(&version(10, Some("W/\"b\""), None)), None);
        assert_eq!(
            was.differs(&version(11, None, None)).as_deref(),
            Some("it is now 11 bytes")
        );
        assert_eq!(was.describe(), "10 bytes");
    }

    #[test]
    fn the_identity_follows_the_etag_size_and_date() {
        let a = version(10, Some("\"a\""), Some(100)).identity();
        assert_eq!(a, version(10, Some("\"a\""), Some(100)).identity());
        assert_ne!(a.ino, version(10, Some("\"b\""), Some(100)).identity().ino);
        assert_ne!(a, version(10, Some("\"a\""), Some(101)).identity());
        assert_eq!((a.dev, a.size, a.mtime, a.mtime_nsec), (0, 10, 100, 0));
        // A weak tag stands in for the strong one.
        let weak = version(10, Some("W/\"a\""), None).identity();
        assert_ne!(weak.ino, version(10, Some("W/\"b\""), None).identity().ino);
        assert_eq!(weak.mtime, 0);
    }

    #[test]
    fn each_version_keeps_what_was_noted_of_it() -> Result<(), staging_core::Error> {
        // Nothing is requested: the versions are recorded by hand.
        let remote = Remote::open(Path::new("http://127.0.0.1:9/"), &Options::default())?;
        let inner = &remote.inner;
        let url = "http://127.0.0.1:9/model.safetensors";
        let old = version(10, Some("\"a\""), None);
        let new = version(10, Some("\"b\""), None);
        assert_eq!(inner.validator(), None);

        inner.record(url, &old);
        let object = Object {
            key: "model.safetensors".into(),
            url: url.to_owned(),
            version: old.clone(),
        };
        let error = inner.changed(&object, "it is now ETag \"b\"");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            error.to_string().contains("it was read at ETag \"a\""),
            "{error}"
        );
        inner.record(url, &new);
        assert_eq!(inner.recorded(url), Some(new.clone()));
        let noted = |v: &Version| {
            inner.versions()[url]
                .iter()
                .find(|t| t.version == *v)
                .map(|t| t.changed.clone())
        };
        // What a response showed of the old version is not held against the new one ...
        assert_eq!(noted(&new), Some(None));
        // ... and the old one, seen again, is the latest once more with its note kept.
        inner.record(url, &old);
        assert_eq!(inner.recorded(url), Some(old.clone()));
        assert_eq!(noted(&old), Some(Some("it is now ETag \"b\"".to_owned())));
        assert_eq!(inner.versions()[url].len(), 2);

        // The weakest validator of all the objects is the one reported.
        assert_eq!(inner.validator(), Some(Validator::Etag));
        inner.record("http://127.0.0.1:9/b.safetensors", &version(5, None, None));
        assert_eq!(inner.validator(), Some(Validator::Size));
        Ok(())
    }
}
