//! A Hub load's configuration: the options a caller gives ([`HubOptions`]), and for what they
//! leave unsaid `huggingface_hub`'s environment, read once per load ([`HubEnv::from_env`], the
//! one place of this crate that reads it) into [`Settings`], which the rest of the load is given.
//!
//! As object_store's builders read theirs: each variable a typed key ([`EnvKey`]), read in one
//! pass; the options given win over the environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How a Hub path is read, besides the remote reader's options (`backend_remote::Options`).
#[derive(Clone)]
pub struct HubOptions {
    /// A model is written into the Hugging Face cache as it streams, as `huggingface_hub`
    /// would have written it (default true); off, it streams without writing anything, and a
    /// model already in the cache is read from the network.
    pub cache: bool,
    /// The Hugging Face cache (default: `HF_HUB_CACHE`, else `$HF_HOME/hub`, as
    /// `huggingface_hub` finds it).
    pub cache_dir: Option<PathBuf>,
    /// The Hub's endpoint (default: `HF_ENDPOINT`, else `https://huggingface.co`).
    pub endpoint: Option<String>,
    /// The Hub token (default: `HF_TOKEN`, else the token file `huggingface_hub` writes).
    /// Never shown.
    pub token: Option<String>,
    /// Whether to ask nothing of the Hub and load from the cache (default: `HF_HUB_OFFLINE`).
    pub offline: Option<bool>,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            cache: true,
            cache_dir: None,
            endpoint: None,
            token: None,
            offline: None,
        }
    }
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_hub(
            f,
            "HubOptions",
            &self.cache,
            &self.cache_dir,
            &self.endpoint,
            &self.token,
            &self.offline,
        )
    }
}

/// `HubOptions`' and `Settings`' `Debug`: every field, the token shown as redacted.
fn debug_hub(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    cache: &dyn std::fmt::Debug,
    cache_dir: &dyn std::fmt::Debug,
    endpoint: &dyn std::fmt::Debug,
    token: &Option<String>,
    offline: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("cache", cache)
        .field("cache_dir", cache_dir)
        .field("endpoint", endpoint)
        .field("token", &token.as_ref().map(|_| backend_remote::REDACTED))
        .field("offline", offline)
        .finish()
}

/// The variables of the environment a Hub load reads, by `huggingface_hub`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EnvKey {
    /// `HF_ENDPOINT`: a mirror.
    Endpoint,
    /// `HF_TOKEN`.
    Token,
    /// `HUGGING_FACE_HUB_TOKEN`, the older name.
    OldToken,
    /// `HF_TOKEN_PATH`: the token file (default `$HF_HOME/token`).
    TokenPath,
    /// `HF_HUB_CACHE`.
    HubCache,
    /// `HUGGINGFACE_HUB_CACHE`, the older name.
    OldHubCache,
    /// `HF_HOME`.
    HfHome,
    /// `XDG_CACHE_HOME`: where `HF_HOME` is by default.
    XdgCacheHome,
    /// `HOME`: what a leading `~` stands for.
    Home,
    /// `HF_HUB_OFFLINE`.
    Offline,
    /// `TRANSFORMERS_OFFLINE`.
    TransformersOffline,
}

impl EnvKey {
    /// Every key, each read once by [`HubEnv::from_env`].
    pub(crate) const ALL: [Self; 11] = [
        Self::Endpoint,
        Self::Token,
        Self::OldToken,
        Self::TokenPath,
        Self::HubCache,
        Self::OldHubCache,
        Self::HfHome,
        Self::XdgCacheHome,
        Self::Home,
        Self::Offline,
        Self::TransformersOffline,
    ];

    /// The variable's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Endpoint => "HF_ENDPOINT",
            Self::Token => "HF_TOKEN",
            Self::OldToken => "HUGGING_FACE_HUB_TOKEN",
            Self::TokenPath => "HF_TOKEN_PATH",
            Self::HubCache => "HF_HUB_CACHE",
            Self::OldHubCache => "HUGGINGFACE_HUB_CACHE",
            Self::HfHome => "HF_HOME",
            Self::XdgCacheHome => "XDG_CACHE_HOME",
            Self::Home => "HOME",
            Self::Offline => "HF_HUB_OFFLINE",
            Self::TransformersOffline => "TRANSFORMERS_OFFLINE",
        }
    }
}

/// What the environment says, as far as a Hub load reads it: each [`EnvKey`] set and not
/// empty. Never shown (it may hold the token).
#[derive(Clone, Default)]
pub(crate) struct HubEnv {
    vars: HashMap<EnvKey, String>,
}

impl HubEnv {
    /// The process's environment, now.
    pub(crate) fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The variables `lookup` gives by name (a test's own environment).
    pub(crate) fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let vars = EnvKey::ALL
            .into_iter()
            .filter_map(|key| {
                let value = lookup(key.name()).filter(|v| !v.is_empty())?;
                Some((key, value))
            })
            .collect();
        Self { vars }
    }

    fn get(&self, key: EnvKey) -> Option<&str> {
        self.vars.get(&key).map(String::as_str)
    }

    /// `~` at the start of `path` as the home directory.
    fn expand_home(&self, path: &str) -> PathBuf {
        match (path.strip_prefix("~/"), self.get(EnvKey::Home)) {
            (Some(rest), Some(home)) => Path::new(home).join(rest),
            (None, Some(home)) if path == "~" => PathBuf::from(home),
            _ => PathBuf::from(path),
        }
    }

    /// `HF_HOME`, as `huggingface_hub` finds it.
    fn hf_home(&self) -> PathBuf {
        if let Some(home) = self.get(EnvKey::HfHome) {
            return self.expand_home(home);
        }
        let cache = self.expand_home(self.get(EnvKey::XdgCacheHome).unwrap_or("~/.cache"));
        cache.join("huggingface")
    }

    /// The Hub cache `huggingface_hub` uses: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else
    /// `$HF_HOME/hub`.
    pub(crate) fn cache_dir(&self) -> PathBuf {
        self.get(EnvKey::HubCache)
            .or_else(|| self.get(EnvKey::OldHubCache))
            .map_or_else(|| self.hf_home().join("hub"), |dir| self.expand_home(dir))
    }

    /// The token `huggingface_hub` sends: `HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`, else the
    /// token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`), trimmed; none when empty.
    fn token(&self) -> Option<String> {
        let clean = |t: &str| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
        if let Some(token) = self
            .get(EnvKey::Token)
            .or_else(|| self.get(EnvKey::OldToken))
        {
            return clean(token);
        }
        let path = self
            .get(EnvKey::TokenPath)
            .map_or_else(|| self.hf_home().join("token"), |p| self.expand_home(p));
        std::fs::read_to_string(path)
            .ok()
            .as_deref()
            .and_then(clean)
    }

    /// `HF_HUB_OFFLINE` or `TRANSFORMERS_OFFLINE`, as `huggingface_hub` takes them.
    fn offline(&self) -> bool {
        is_true(self.get(EnvKey::Offline)) || is_true(self.get(EnvKey::TransformersOffline))
    }
}

/// `huggingface_hub`'s idea of true (`1`, `ON`, `YES`, `TRUE`, any case).
fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

/// A load's configuration, settled: the options given, the environment read once for the rest.
#[derive(Clone)]
pub(crate) struct Settings {
    /// Whether the cache is read and written ([`HubOptions::cache`]).
    pub(crate) cache: bool,
    /// The Hugging Face cache.
    pub(crate) cache_dir: PathBuf,
    /// The endpoint as given or set (checked when a connection is made: an offline load
    /// never needs it).
    endpoint: String,
    /// The token, never shown.
    pub(crate) token: Option<String>,
    /// Whether no request may be made.
    pub(crate) offline: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_hub(
            f,
            "Settings",
            &self.cache,
            &self.cache_dir,
            &self.endpoint,
            &self.token,
            &self.offline,
        )
    }
}

impl Settings {
    /// `options`, the environment read now ([`HubEnv::from_env`]) for what they leave unsaid:
    /// what each entry point (`open`, `changes`) does once, first.
    pub(crate) fn from_env(options: &HubOptions) -> Self {
        Self::new(options, &HubEnv::from_env())
    }

    /// `options`, `env` for what they leave unsaid.
    pub(crate) fn new(options: &HubOptions, env: &HubEnv) -> Self {
        Self {
            cache: options.cache,
            cache_dir: options.cache_dir.clone().unwrap_or_else(|| env.cache_dir()),
            endpoint: options
                .endpoint
                .clone()
                .or_else(|| env.get(EnvKey::Endpoint).map(str::to_owned))
                .unwrap_or_else(|| "https://huggingface.co".to_owned()),
            token: options.token.clone().or_else(|| env.token()),
            offline: options.offline.unwrap_or_else(|| env.offline()),
        }
    }

    /// The endpoint, without a trailing `/`, or why it is not one.
    pub(crate) fn endpoint(&self) -> Result<url::Url, String> {
        let text = &self.endpoint;
        let trimmed = text.trim_end_matches('/');
        let url = url::Url::parse(trimmed)
            .map_err(|e| format!("HF_ENDPOINT={text:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!("HF_ENDPOINT={text:?} is not an http(s) URL"));
        }
        if url.query().is_some() || !url.username().is_empty() {
            return Err(format!(
                "HF_ENDPOINT={text:?}: a query or login is not supported"
            ));
        }
        Ok(url)
    }
}

/// The Hub cache `huggingface_hub` uses: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else
/// `$HF_HOME/hub`.
pub fn default_cache_dir() -> PathBuf {
    HubEnv::from_env().cache_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> HubEnv {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        HubEnv::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn the_environment_fills_in_what_the_options_leave_unsaid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), " hf_file \n").unwrap();
        let home = dir.path().to_str().unwrap();
        let set = env(&[
            ("HF_HOME", home),
            ("HF_ENDPOINT", "http://mirror.example/"),
            ("HF_HUB_OFFLINE", "yes"),
            ("HOME", "/home/someone"),
        ]);
        let settings = Settings::new(&HubOptions::default(), &set);
        assert_eq!(settings.cache_dir, dir.path().join("hub"));
        assert_eq!(settings.token.as_deref(), Some("hf_file"));
        assert!(settings.offline);
        assert_eq!(
            settings.endpoint().unwrap().as_str(),
            "http://mirror.example/"
        );
        // The options given win.
        let given = HubOptions {
            cache_dir: Some("/given".into()),
            endpoint: Some("https://other.example".into()),
            token: Some("hf_given".into()),
            offline: Some(false),
            ..HubOptions::default()
        };
        let settings = Settings::new(&given, &set);
        assert_eq!(settings.cache_dir, Path::new("/given"));
        assert_eq!(settings.token.as_deref(), Some("hf_given"));
        assert!(!settings.offline);
        assert!(!format!("{settings:?}").contains("hf_given"));
    }

    #[test]
    fn the_cache_and_token_are_found_as_huggingface_hub_finds_them() {
        let bare = env(&[("HOME", "/h")]);
        assert_eq!(bare.cache_dir(), Path::new("/h/.cache/huggingface/hub"));
        assert_eq!(
            env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "~/xdg")]).cache_dir(),
            Path::new("/h/xdg/huggingface/hub")
        );
        assert_eq!(
            env(&[("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "")]).cache_dir(),
            Path::new("/old")
        );
        assert_eq!(
            env(&[("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "/new")]).cache_dir(),
            Path::new("/new")
        );
        let tokens = env(&[("HUGGING_FACE_HUB_TOKEN", "hf_old"), ("HF_TOKEN", "  ")]);
        assert_eq!(tokens.token(), None, "HF_TOKEN set wins, even blank");
        assert_eq!(
            env(&[("HUGGING_FACE_HUB_TOKEN", "hf_old")])
                .token()
                .as_deref(),
            Some("hf_old")
        );
        assert!(!env(&[("HF_HUB_OFFLINE", "0")]).offline());
        assert!(env(&[("TRANSFORMERS_OFFLINE", "True")]).offline());
    }

    #[test]
    fn a_bad_endpoint_says_so() {
        let with = |endpoint: &str| {
            let options = HubOptions {
                endpoint: Some(endpoint.into()),
                ..HubOptions::default()
            };
            Settings::new(&options, &HubEnv::default()).endpoint()
        };
        assert!(with("ftp://x").unwrap_err().contains("not an http(s) URL"));
        assert!(with("http://u@x").unwrap_err().contains("login"));
        assert!(with("not a url").unwrap_err().contains("not a URL"));
        assert_eq!(with("https://x/m/").unwrap().as_str(), "https://x/m");
    }
}
