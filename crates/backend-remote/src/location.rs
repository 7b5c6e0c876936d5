//! Where a URL points: which store (scheme and bucket, container or host) and which key in it.
//!
//! Paths travel through the library as `Path`s (`s3://bucket/prefix/model.safetensors`): the
//! checkpoint code joins shard names onto them like onto local directories. This module turns
//! one back into a root and an object key, and refuses what is not a URL this crate reads.

use std::path::Path;

use object_store::path::Path as Key;

/// The kinds of store this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Amazon S3 and S3-compatible stores (`s3://`, `s3a://`).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`az://`, `abfs://`, `abfss://`, `azure://`).
    Azure,
    /// A plain HTTP(S) server that answers `HEAD` and ranged `GET` (`http://`, `https://`).
    Http,
}

impl Scheme {
    /// The scheme of `url`'s text, when it is one this crate reads.
    pub fn of(scheme: &str) -> Option<Self> {
        match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Some(Self::S3),
            "gs" => Some(Self::Gcs),
            "az" | "abfs" | "abfss" | "azure" => Some(Self::Azure),
            "http" | "https" => Some(Self::Http),
            _ => None,
        }
    }
}

/// A URL split into its store's root (`s3://bucket`, `https://host:port`) and a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) scheme: Scheme,
    /// `scheme://authority`, as written (lowercase scheme).
    pub(crate) root: String,
    /// The object key or prefix (no leading or trailing `/`).
    pub(crate) key: Key,
}

impl Location {
    /// Parses `path`; the error says why it is not a URL this crate reads.
    pub(crate) fn parse(path: &Path) -> Result<Self, String> {
        let text = path
            .to_str()
            .ok_or_else(|| "a URL must be valid UTF-8".to_owned())?;
        let url = url::Url::parse(text).map_err(|e| format!("not a valid URL: {e}"))?;
        let scheme = Scheme::of(url.scheme()).ok_or_else(|| {
            format!(
                "unsupported scheme {:?} (s3, gs, az, http and https are)",
                url.scheme()
            )
        })?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err("a query or fragment in the URL is not supported".to_owned());
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| "the URL names no bucket, container or host".to_owned())?;
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        let root = format!("{}://{authority}", url.scheme().to_ascii_lowercase());
        let raw = url.path().trim_matches('/');
        // The URL parser already percent-encoded what needs it and resolved dot segments;
        // decoding gives the object key itself.
        let key = Key::from_url_path(raw).map_err(|e| format!("not a valid object key: {e}"))?;
        Ok(Self { scheme, root, key })
    }

    /// The URL of `key` under this location's root.
    pub(crate) fn url_of(&self, key: &Key) -> String {
        if key.as_ref().is_empty() {
            self.root.clone()
        } else {
            format!("{}/{}", self.root, key.as_ref())
        }
    }

    /// The key's last segment (`model.safetensors`), if any.
    pub(crate) fn file_name(key: &Key) -> Option<&str> {
        key.as_ref().rsplit('/').next().filter(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Location, String> {
        Location::parse(Path::new(s))
    }

    #[test]
    fn splits_root_and_key() -> Result<(), String> {
        let l = parse("s3://bucket/models/minilm/model.safetensors")?;
        assert_eq!(l.scheme, Scheme::S3);
        assert_eq!(l.root, "s3://bucket");
        assert_eq!(l.key.as_ref(), "models/minilm/model.safetensors");
        assert_eq!(
            l.url_of(&l.key),
            "s3://bucket/models/minilm/model.safetensors"
        );
        assert_eq!(Location::file_name(&l.key), Some("model.safetensors"));

        let l = parse("S3A://bucket/prefix/")?;
        assert_eq!((l.scheme, l.root.as_str()), (Scheme::S3, "s3a://bucket"));
        assert_eq!(l.key.as_ref(), "prefix");

        let l = parse("http://127.0.0.1:8080/a%20b/model.safetensors")?;
        assert_eq!(l.scheme, Scheme::Http);
        assert_eq!(l.root, "http://127.0.0.1:8080");
        assert_eq!(l.key.as_ref(), "a b/model.safetensors");

        let l = parse("gs://bucket")?;
        assert_eq!((l.scheme, l.key.as_ref()), (Scheme::Gcs, ""));
        assert_eq!(l.url_of(&l.key), "gs://bucket");
        assert_eq!(parse("az://container/x")?.scheme, Scheme::Azure);
        Ok(())
    }

    #[test]
    fn joined_paths_parse_back() -> Result<(), String> {
        // What the checkpoint code does: join a shard name onto the directory's path.
        let dir = Path::new("s3://bucket/prefix");
        let l = Location::parse(&dir.join("model-00001-of-00002.safetensors"))?;
        assert_eq!(l.key.as_ref(), "prefix/model-00001-of-00002.safetensors");
        let l = Location::parse(&Path::new("s3://bucket/").join("x.safetensors"))?;
        assert_eq!(l.key.as_ref(), "x.safetensors");
        Ok(())
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for (url, why) in [
            ("ftp://host/x", "unsupported scheme"),
            ("s3:///key", "no bucket"),
            ("https://host/x?sig=1", "query"),
            ("not a url", "not a valid URL"),
        ] {
            let result = parse(url);
            assert!(
                result.as_ref().is_err_and(|e| e.contains(why)),
                "{url}: {result:?}"
            );
        }
    }
}
