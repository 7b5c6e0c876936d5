//! `hf://org/name[@revision][/path]`: a model on the Hugging Face Hub, as every door takes it.

use std::io;
use std::path::{Path, PathBuf};

use staging_core::Error;

/// A model on the Hub: `hf://org/name`, optionally `@revision` (a branch, tag or commit; a
/// revision holding `/`, such as `refs/pr/1`, is written percent-encoded: `@refs%2Fpr%2F1`)
/// and a path inside the repository (a directory, an index or one `.safetensors` file).
/// A model without an organization (`hf://gpt2`) has one segment before its revision or path
/// only when the revision is given (`hf://gpt2@main/model.safetensors`) or nothing follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubPath {
    /// `org/name`.
    pub repo: String,
    /// The revision given, if any (`main` when none).
    pub revision: Option<String>,
    /// The path inside the repository, if any (`/`-separated, checked: no `..`).
    pub path: Option<String>,
}

/// Whether `path` is a Hub path (`hf://...`): core's answer, the one every door uses.
pub use staging_core::is_hub;

/// Whether `name` is a repository name (or organization) as the Hub takes one: 1 to 96 of
/// `A-Za-z0-9`, `-`, `_`, `.`, not starting or ending with `-` or `.`, without `--` or `..`
/// (the rules of `huggingface_hub`'s `validate_repo_id`).
fn is_name(name: &str) -> bool {
    (1..=96).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
        && !name.contains("--")
        && !name.contains("..")
}

/// Whether `repo` is a repository id as the Hub takes one (`huggingface_hub`'s
/// `validate_repo_id`): `name` or `org/name`, each 1 to 96 of `A-Z a-z 0-9 - _ .`, not starting
/// or ending with `-` or `.`, no `--` or `..`, and not ending with `.git`.
pub fn is_repo_id(repo: &str) -> bool {
    if repo.ends_with(".git") {
        return false;
    }
    let mut parts = repo.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => is_name(name),
        (Some(org), Some(name), None) => is_name(org) && is_name(name),
        _ => false,
    }
}

impl HubPath {
    /// Parses `hf://...`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("hf"))
            .map(|(_, rest)| rest)
            .ok_or_else(|| "a Hub path starts with hf://".to_owned())?;
        if rest.contains(['?', '#']) {
            return Err("a query or fragment in a Hub path is not supported".to_owned());
        }
        let rest = rest.trim_end_matches('/');
        let mut segments: Vec<&str> = rest.split('/').collect();
        if let Some(kind @ ("datasets" | "spaces")) = segments.first().copied() {
            return Err(format!(
                "hf://{kind}/... is not a model: only model repositories are loaded"
            ));
        }
        if segments.first() == Some(&"models") {
            segments.remove(0);
        }
        // The repository: `org/name`, unless the first segment carries the revision or is
        // all there is.
        let first = segments.first().copied().unwrap_or("");
        let take = if first.contains('@') || segments.len() == 1 {
            1
        } else {
            2
        };
        let (repo_segments, path_segments) = segments.split_at(take.min(segments.len()));
        let joined = repo_segments.join("/");
        let (repo, revision) = match joined.split_once('@') {
            Some((repo, revision)) => {
                let revision = percent_encoding::percent_decode_str(revision)
                    .decode_utf8()
                    .map_err(|_| "the revision is not valid UTF-8".to_owned())?
                    .into_owned();
                if revision.is_empty() {
                    return Err("an empty revision after '@'".to_owned());
                }
                // A revision names a file under `refs/` in the cache: a plain relative path.
                staging_core::checked_components(&revision)
                    .map_err(|why| format!("the revision {revision:?} {why}"))?;
                (repo.to_owned(), Some(revision))
            }
            None => (joined, None),
        };
        if !is_repo_id(&repo) {
            return Err(format!(
                "{repo:?} is not a model id: org/name, each of A-Z a-z 0-9 - _ . (not starting \
                 or ending with - or ., no -- or ..), at most 96 characters"
            ));
        }
        let path = if path_segments.is_empty() {
            None
        } else {
            let path = path_segments.join("/");
            staging_core::checked_components(&path)
                .map_err(|why| format!("the path {path:?} {why}"))?;
            Some(path)
        };
        Ok(Self {
            repo,
            revision,
            path,
        })
    }

    /// The revision, `main` when none was given.
    pub fn revision_or_main(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// `models--org--name`: the repository's folder in the cache.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

impl std::fmt::Display for HubPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hf://{}", self.repo)?;
        if let Some(revision) = &self.revision {
            let encoded: String =
                percent_encoding::utf8_percent_encode(revision, &REVISION).collect();
            write!(f, "@{encoded}")?;
        }
        if let Some(path) = &self.path {
            write!(f, "/{path}")?;
        }
        Ok(())
    }
}

/// What a revision has percent-encoded in a Hub path: `/` (it would start the path), `%`, `@`.
const REVISION: percent_encoding::AsciiSet =
    percent_encoding::CONTROLS.add(b'/').add(b'%').add(b'@');

/// `path` as a Hub path, or why not.
pub(crate) fn parse(path: &Path) -> Result<HubPath, Error> {
    let text = path.to_str().ok_or_else(|| Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "a Hub path must be UTF-8"),
    })?;
    HubPath::parse(text).map_err(|why| Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why),
    })
}

/// An error about `what`, as the core reports one.
pub(crate) fn error_at(what: &HubPath, e: io::Error) -> Error {
    Error::Io {
        path: PathBuf::from(what.to_string()),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HubPath, String> {
        HubPath::parse(text)
    }

    #[test]
    fn hub_paths_parse() {
        let p = parse("hf://org/name").unwrap();
        assert_eq!(
            (p.repo.as_str(), p.revision, p.path),
            ("org/name", None, None)
        );
        let p = parse("hf://org/name@v1.0/sub/model.safetensors").unwrap();
        assert_eq!(p.repo, "org/name");
        assert_eq!(p.revision.as_deref(), Some("v1.0"));
        assert_eq!(p.path.as_deref(), Some("sub/model.safetensors"));
        let p = parse("hf://org/name@refs%2Fpr%2F1").unwrap();
        assert_eq!(p.revision.as_deref(), Some("refs/pr/1"));
        assert_eq!(p.to_string(), "hf://org/name@refs%2Fpr%2F1");
        let p = parse("HF://gpt2").unwrap();
        assert_eq!(p.repo, "gpt2");
        let p = parse("hf://gpt2@main/model.safetensors").unwrap();
        assert_eq!(
            (p.repo.as_str(), p.path.as_deref()),
            ("gpt2", Some("model.safetensors"))
        );
        let p = parse("hf://models/org/name/").unwrap();
        assert_eq!((p.repo.as_str(), p.path.as_deref()), ("org/name", None));
        assert_eq!(p.cache_folder(), "models--org--name");
        assert_eq!(p.revision_or_main(), "main");
        assert!(
            is_hub(std::path::Path::new("hf://x/y"))
                && !is_hub(std::path::Path::new("https://x/y"))
        );
    }

    #[test]
    fn hostile_hub_paths_are_refused() {
        for (text, why) in [
            ("hf://datasets/org/name", "not a model"),
            ("hf://org/na..me", "not a model id"),
            ("hf://org/-name", "not a model id"),
            ("hf://org--x/name", "not a model id"),
            ("hf://../name", "not a model id"),
            ("hf://org/name@", "empty revision"),
            ("hf://org/name@..%2F..%2Fx", "'..'"),
            ("hf://org/name@%2Fetc", "absolute"),
            ("hf://org/name/../../x", "'..'"),
            ("hf://org/name?x=1", "query"),
            ("hf://", "not a model id"),
            ("s3://org/name", "hf://"),
        ] {
            let result = parse(text);
            assert!(
                result.as_ref().is_err_and(|e| e.contains(why)),
                "{text}: {result:?}"
            );
        }
        assert!(is_repo_id("Org_1/name.v2-x") && !is_repo_id("a/b/c") && !is_repo_id(""));
    }
}
