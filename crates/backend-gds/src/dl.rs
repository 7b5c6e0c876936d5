//! Loading native libraries at run time, the same way for every backend: an explicit path, else
//! an environment variable, else the usual names in order; every failure is reported with the
//! loader's own message (libloading's `Display` is only "dlopen failed"). The [`Opened`]
//! library hands out its symbols, a missing required one as a [`MissingSymbol`] that each
//! backend's error type takes in.

use std::path::{Path, PathBuf};

use libloading::Library;

/// The loader's message for a libloading error.
pub fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    }
}

/// A library as opened by [`load`], with the path it was opened from.
pub struct Opened {
    /// The library; the symbols read from it are valid while it lives.
    pub library: Library,
    /// The path (or name) it was opened from.
    pub path: PathBuf,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").field("path", &self.path).finish()
    }
}

/// A required symbol that the library lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSymbol {
    /// The library's path.
    pub library: PathBuf,
    /// The symbol asked for.
    pub symbol: &'static str,
    /// The loader's message.
    pub detail: String,
}

impl Opened {
    /// A required symbol, copied out of the library; `Err` names the library and the symbol.
    ///
    /// # Safety
    /// As [`symbol`]: `T` is the C signature of `name`, and the value must not outlive the
    /// library.
    pub unsafe fn required<T: Copy>(&self, name: &'static str) -> Result<T, MissingSymbol> {
        // SAFETY: the caller's contract.
        unsafe { symbol(&self.library, name) }.map_err(|detail| self.missing(name, detail))
    }

    /// An optional symbol: `None` where the library lacks it.
    ///
    /// # Safety
    /// As [`symbol`].
    pub unsafe fn optional<T: Copy>(&self, name: &str) -> Option<T> {
        // SAFETY: the caller's contract.
        unsafe { symbol(&self.library, name) }.ok()
    }

    /// The error for `symbol` missing from this library, with the loader's `detail`.
    pub fn missing(&self, symbol: &'static str, detail: String) -> MissingSymbol {
        MissingSymbol {
            library: self.path.clone(),
            symbol,
            detail,
        }
    }
}

/// Loads the first library that opens among: `explicit`, else `$env`, else `defaults`. On
/// failure, returns every name tried with its loader message, joined by "; ".
///
/// # Safety
/// Loading a library runs its initializers: the candidates must be the libraries the caller
/// means to use (the vendor's, or a test stub).
pub unsafe fn load(
    explicit: Option<&Path>,
    env: &str,
    defaults: &[&str],
) -> Result<Opened, String> {
    let from_env = std::env::var_os(env).map(PathBuf::from);
    let candidates: Vec<PathBuf> = match explicit.map(Path::to_path_buf).or(from_env) {
        Some(path) => vec![path],
        None => defaults.iter().map(PathBuf::from).collect(),
    };
    let mut tried = Vec::new();
    for candidate in candidates {
        // SAFETY: the caller's contract.
        match unsafe { Library::new(&candidate) } {
            Ok(library) => {
                return Ok(Opened {
                    library,
                    path: candidate,
                });
            }
            Err(e) => {
                // dlerror's message starts with the name itself when the file was not found
                // ("libx.so: cannot open shared object file: ..."): the name once.
                let (name, message) = (candidate.display().to_string(), loader_message(&e));
                tried.push(if message.starts_with(&format!("{name}: ")) {
                    message
                } else {
                    format!("{name}: {message}")
                });
            }
        }
    }
    Err(tried.join("; "))
}

/// A required symbol, copied out of `library`; `Err` carries the loader's message.
///
/// # Safety
/// `T` must be the C signature of `symbol`, and the value must not outlive `library`.
pub unsafe fn symbol<T: Copy>(library: &Library, symbol: &str) -> Result<T, String> {
    // SAFETY: the caller's contract.
    unsafe { library.get::<T>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| loader_message(&e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code asserts by panicking

    #[test]
    fn a_missing_library_is_named_once_per_name_tried() {
        // SAFETY: neither name exists, so nothing is loaded.
        let tried = unsafe {
            super::load(
                None,
                "STAGING_TEST_NO_SUCH_VARIABLE",
                &["libstaging-none-a.so", "libstaging-none-b.so.1"],
            )
        }
        .unwrap_err();
        assert_eq!(
            tried,
            "libstaging-none-a.so: cannot open shared object file: No such file or directory; \
             libstaging-none-b.so.1: cannot open shared object file: No such file or directory"
        );
    }
}
