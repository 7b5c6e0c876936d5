//! Where a URL points: which store (scheme and bucket, container or host) and which key in it.
//!
//! Paths travel through the library as `Path`s (`s3://bucket/prefix/model.safetensors`). This
//! module turns one back into a root and an object key, refuses what is not a URL this crate
//! reads, and joins names under a prefix at the object-key level ([`Location::join`]): a name
//! is never re-read as URL text, so `%2e%2e` or a backslash cannot climb out of the prefix.
//! What a URL's text may carry that must not be shown (a login, a query) is taken off here
//! ([`redacted`]), and a login is kept apart from the location ([`Login`]).

use std::path::{Path, PathBuf};

use object_store::path::Path as Key;

/// What stands for a secret in every text this crate makes.
pub const REDACTED: &str = "<redacted>";

/// The user and password of an `http(s)://user:password@host/` URL: sent as HTTP Basic
/// authentication to that host only, and never shown (`Debug` hides the password).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Login {
    pub(crate) user: String,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The user too: a token is often given as the user (`https://TOKEN@host/`).
        f.debug_struct("Login")
            .field("user", &REDACTED)
            .field("password", &self.password.as_ref().map(|_| REDACTED))
            .finish()
    }
}

/// `url` with what a URL may carry that is not for showing taken off: a login
/// (`user:password@`) becomes `<redacted>@`, a query `?<redacted>`, a fragment is dropped. A
/// URL that does not parse but holds an `@` (a password with a `#` or `/` in it, say) shows
/// only its scheme: `https://<redacted>`. Text that is not a URL is returned as it is.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Ok(parsed) = url::Url::parse(url) else {
        if rest.contains('@') {
            return format!("{scheme}://{REDACTED}");
        }
        return match rest.split_once(['?', '#']) {
            Some((before, _)) => format!("{scheme}://{before}?{REDACTED}"),
            None => url.to_owned(),
        };
    };
    let login = if parsed.username().is_empty() && parsed.password().is_none() {
        String::new()
    } else {
        format!("{REDACTED}@")
    };
    let host = parsed.host_str().unwrap_or("");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if parsed.query().is_some() || parsed.fragment().is_some() {
        format!("?{REDACTED}")
    } else {
        String::new()
    };
    // The parser writes `http://host` as `http://host/`: a path only where the text had one.
    let path = match parsed.path() {
        "/" if !rest.contains('/') => "",
        path => path,
    };
    format!("{scheme}://{login}{host}{port}{path}{query}")
}

/// `text` (an error message, say) with every URL in it [`redacted`]: object_store's and
/// reqwest's messages name the request's URL, login and query included.
pub fn redacted_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` just before `://`.
        let scheme_start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        // The URL: up to the first whitespace, quote or angle bracket.
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..scheme_start]);
        if scheme_start < at {
            out.push_str(&redacted(&rest[scheme_start..end]));
        } else {
            out.push_str(&rest[scheme_start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// [`redacted`] for a path.
pub fn redacted_path(path: &Path) -> PathBuf {
    match path.to_str() {
        Some(text) => PathBuf::from(redacted(text)),
        None => path.to_path_buf(),
    }
}

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
    /// Parses `path`; the error says why it is not a URL this crate reads. A login in it is
    /// not part of the location (see [`login`](Self::login)).
    pub(crate) fn parse(path: &Path) -> Result<Self, String> {
        let url = Self::url(path)?;
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

    fn url(path: &Path) -> Result<url::Url, String> {
        let text = path
            .to_str()
            .ok_or_else(|| "a URL must be valid UTF-8".to_owned())?;
        url::Url::parse(text).map_err(|e| format!("not a valid URL: {e}"))
    }

    /// The login `path` carries (`http://user:password@host/`), if any. Only an HTTP(S) server
    /// is sent one (as Basic authentication); in an `s3://`, `gs://` or `az://` URL it is an
    /// error: those stores take credentials from the environment or the store options.
    pub(crate) fn login(path: &Path) -> Result<Option<Login>, String> {
        let url = Self::url(path)?;
        if url.username().is_empty() && url.password().is_none() {
            return Ok(None);
        }
        if Scheme::of(url.scheme()) != Some(Scheme::Http) {
            return Err(format!(
                "a {}:// URL takes no login: give credentials in the store options or the \
                 environment (AWS_ACCESS_KEY_ID, ...)",
                url.scheme()
            ));
        }
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8()
                .map(|t| t.into_owned())
                .map_err(|_| "the URL's login is not valid UTF-8".to_owned())
        };
        Ok(Some(Login {
            user: decode(url.username())?,
            password: url.password().map(decode).transpose()?,
        }))
    }

    /// The URL of `name` (`/`-separated, as an index names a shard) under this location's key,
    /// joined one component at a time as object keys: each component must be a plain name
    /// (not empty, `.` or `..`; no backslash or control character), and none may be read by a
    /// server as anything else: no `%` (URL text), no `;` (path parameters: `..;` climbs out on
    /// some servers), none of dots and spaces only (`.. ` is `..` to others). See
    /// [`child`](Self::child) for the rest.
    pub(crate) fn join(&self, name: &str) -> Result<String, String> {
        for part in staging_core::checked_components(name)? {
            // A `%` is the name's own (encoded as `%25`, as `huggingface_hub` quotes a file
            // name), unless decoding it once more gives a separator or a dot segment: a server
            // that decodes twice would read another path there.
            if part.contains('%') {
                let twice = percent_encoding::percent_decode_str(part).decode_utf8_lossy();
                if twice.contains(['/', '\\']) || twice.chars().all(|c| c == '.' || c == ' ') {
                    return Err(format!(
                        "contains '%' that decodes to {twice:?}: a server that decodes twice \
                         would read another path"
                    ));
                }
            }
            if part.contains(';') {
                return Err("contains ';', which a server may read as path parameters".into());
            }
            if part.chars().all(|c| c == '.' || c == ' ') {
                return Err(format!(
                    "has a component of dots and spaces only ({part:?})"
                ));
            }
        }
        self.child(name)
    }

    /// The URL of the object `name` (components separated by `/`, each an object name of its
    /// own) under this location's key: each component percent-encoded as the URL's path needs,
    /// and the URL checked to parse back to exactly that key, under this one.
    pub(crate) fn child(&self, name: &str) -> Result<String, String> {
        let expected = if self.key.as_ref().is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.key.as_ref())
        };
        let expected = Key::parse(&expected).map_err(|e| format!("is not an object name: {e}"))?;
        let url = self.url_of(&expected);
        let joined = Self::parse(Path::new(&url))?;
        if joined.root != self.root
            || joined.key != expected
            || !joined.key.prefix_matches(&self.key)
        {
            return Err(format!(
                "does not name an object under {}",
                self.url_of(&self.key)
            ));
        }
        Ok(url)
    }

    /// The URL of `key` under this location's root.
    pub(crate) fn url_of(&self, key: &Key) -> String {
        let mut url = match url::Url::parse(&self.root) {
            Ok(url) => url,
            Err(_) => return format!("{}/{}", self.root, key.as_ref()),
        };
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.clear();
            if !key.as_ref().is_empty() {
                segments.extend(key.as_ref().split('/'));
            }
        }
        let text: String = url.into();
        // `s3://bucket/` and `s3://bucket` are one location: the root is written without
        // the slash.
        match text.strip_suffix('/') {
            Some(root) if key.as_ref().is_empty() => root.to_owned(),
            _ => text,
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
    fn names_join_as_object_keys_under_their_prefix() -> Result<(), String> {
        let dir = parse("s3://bkt/models/a")?;
        assert_eq!(
            dir.join("model-00001-of-00002.safetensors")?,
            "s3://bkt/models/a/model-00001-of-00002.safetensors"
        );
        assert_eq!(
            dir.join("sub/x.safetensors")?,
            "s3://bkt/models/a/sub/x.safetensors"
        );
        // Characters a URL would read as something else are the object name's own.
        let odd = dir.join("a b?#.safetensors")?;
        assert_eq!(odd, "s3://bkt/models/a/a%20b%3F%23.safetensors");
        assert_eq!(parse(&odd)?.key.as_ref(), "models/a/a b?#.safetensors");
        let root = parse("http://127.0.0.1:9/")?;
        assert_eq!(root.join("x.json")?, "http://127.0.0.1:9/x.json");
        // A '%' is a character of the name (as `huggingface_hub` quotes it).
        let percent = dir.join("100%/part%202.safetensors")?;
        assert_eq!(percent, "s3://bkt/models/a/100%25/part%25202.safetensors");
        assert_eq!(
            parse(&percent)?.key.as_ref(),
            "models/a/100%/part%202.safetensors"
        );
        for (name, why) in [
            (
                "%2e%2e/%2e%2e/secret/model.safetensors",
                "decodes to \"..\"",
            ),
            ("..%2fsecret", "decodes to \"../secret\""),
            ("a%5Cb", "decodes to \"a\\\\b\""),
            ("../secret", "'..'"),
            ("./x", "'.'"),
            ("/x", "absolute"),
            ("a//b", "empty"),
            ("..\\x", "backslash"),
            ("a\tb", "control"),
            ("", "empty"),
            ("..;/secret.safetensors", "';'"),
            ("a;b.safetensors", "';'"),
            (".. /secret.safetensors", "dots and spaces"),
            ("... /x", "dots and spaces"),
        ] {
            let result = dir.join(name);
            assert!(
                result.as_ref().is_err_and(|e| e.contains(why)),
                "{name:?}: {result:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn logins_are_http_only_and_never_shown() -> Result<(), String> {
        let login = Location::login(Path::new("https://alice:p%40ss@host/x"))?;
        let login = login.ok_or("no login")?;
        assert_eq!(
            (login.user.as_str(), login.password.as_deref()),
            ("alice", Some("p@ss"))
        );
        assert!(!format!("{login:?}").contains("p@ss") && !format!("{login:?}").contains("alice"));
        assert_eq!(Location::login(Path::new("https://host/x"))?, None);
        let refused = Location::login(Path::new("s3://AKID:secret@bkt/x"));
        assert!(refused.is_err_and(|e| !e.contains("secret") && e.contains("no login")));
        // The location itself carries no login.
        assert_eq!(
            parse("https://alice:pw@host:8443/x")?.root,
            "https://host:8443"
        );
        Ok(())
    }

    #[test]
    fn redaction_takes_off_logins_and_queries() {
        for (text, shown) in [
            ("http://alice:pw@host/x", "http://<redacted>@host/x"),
            ("https://host/x?sig=abc&se=1", "https://host/x?<redacted>"),
            ("az://acct@c/x#frag", "az://<redacted>@c/x?<redacted>"),
            ("s3://bkt/key", "s3://bkt/key"),
            ("s3://bkt/a%20b", "s3://bkt/a%20b"),
            ("/local/path@2/x?y", "/local/path@2/x?y"),
            ("http://a@b@host", "http://<redacted>@host"),
            ("http://127.0.0.1:9000/bkt", "http://127.0.0.1:9000/bkt"),
            // A password with characters a URL ends its authority at: nothing of it is shown.
            ("https://user:abc#def@host/x", "https://<redacted>"),
            ("https://user:a/b@host/x", "https://<redacted>"),
            ("hf://org/name@main", "hf://org/name@main"),
        ] {
            assert_eq!(redacted(text), shown, "{text}");
        }
        let message = "Error performing HEAD http://user:SECRET@127.0.0.1:9/bkt/x in 2ms \
             (\"https://h/y?sig=SECRET\"), see s3://bkt/k.";
        let shown = redacted_text(message);
        assert_eq!(
            shown,
            "Error performing HEAD http://<redacted>@127.0.0.1:9/bkt/x in 2ms \
             (\"https://h/y?<redacted>\"), see s3://bkt/k."
        );
        assert_eq!(redacted_text("no url here: a://"), "no url here: a://");
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
