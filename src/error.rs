//! The facade's error: what opening a backend or a load, or using a loaded tensor, can fail with.

use std::error::Error as StdError;

use staging_core::ErrorKind;

/// Everything [`Loader`](crate::Loader) and [`Tensor`](crate::Tensor) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The checkpoint or the load failed (bad input, a read error, an allocation error): the
    /// message names the file, and the tensor and offset where there is one.
    #[error(transparent)]
    Load(#[from] staging_core::Error),
    /// A reload's targets do not fit the checkpoint ([`Loader::load_into`]): a length, dtype or
    /// shape, or (strict) a target the checkpoint lacks or a tensor no target takes. Nothing
    /// was written.
    ///
    /// [`Loader::load_into`]: crate::Loader::load_into
    #[error("the checkpoint does not fit the targets, nothing was written: {}", problems.join("; "))]
    Mismatch {
        /// One line per tensor that does not fit.
        problems: Vec<String>,
    },
    /// A reload failed after writing began ([`Loader::load_into`]): what each target holds.
    ///
    /// [`Loader::load_into`]: crate::Loader::load_into
    #[error(
        "the load into the targets failed after writing began: {source}; {} hold the checkpoint's bytes, {} may hold some of them ({}), {} are unchanged",
        written.len(), partly_written.len(), partly_written.join(", "), unchanged.len()
    )]
    PartialLoad {
        /// Why it failed.
        #[source]
        source: Box<Error>,
        /// Targets that hold the checkpoint's bytes, whole.
        written: Vec<String>,
        /// Targets whose writing had begun and not ended: some bytes may be new, some old.
        partly_written: Vec<String>,
        /// Targets never written.
        unchanged: Vec<String>,
    },
    /// The backend asked for cannot run here (no driver, no device, no library, a mode that is
    /// not available).
    #[error("{backend} backend: {source}")]
    Backend {
        /// The backend (`cufile`, `hipfile`).
        backend: &'static str,
        /// Why, as the backend says it.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The backend was left out of this build.
    #[error("the {0} backend is not built into this library (cargo feature `{0}`)")]
    NotBuilt(&'static str),
    /// The destination hands out memory of another kind than the backend loads into.
    #[error(
        "the destination gives {given} memory, but the {backend} backend loads into {expected} memory"
    )]
    DestinationSpace {
        /// The backend chosen.
        backend: String,
        /// The memory it loads into.
        expected: &'static str,
        /// The memory the destination gives.
        given: &'static str,
    },
    /// An option's value does not parse, or the key is unknown.
    #[error("option {key}={value:?}: {reason}")]
    InvalidOption {
        /// The key (`chunk_size`, `device`, ...).
        key: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// The backend and the device asked for do not go together (`host` and a GPU, `cufile` and
    /// `cpu`).
    #[error("backend {backend} cannot load onto device {device}: {hint}")]
    DeviceMismatch {
        /// The backend asked for.
        backend: &'static str,
        /// The device asked for.
        device: String,
        /// What would go together.
        hint: &'static str,
    },
    /// A GPU was asked for, and no GPU backend can run here.
    #[error("device {device}: no usable GPU: {reason}")]
    NoGpu {
        /// The device asked for.
        device: String,
        /// Why, in a few words (`NVIDIA driver not found`); [`details`](Error::details) has
        /// each backend's own reason.
        reason: String,
        /// `"backend: why"` for each GPU backend passed over.
        passed_over: Vec<String>,
    },
    /// Copying a tensor's bytes off the device failed.
    #[error("tensor {tensor:?}: {reason}")]
    DeviceCopy {
        /// The tensor.
        tensor: String,
        /// The device's error.
        reason: String,
    },
    /// A tensor's bytes cannot be had this way (a caller destination's bytes are the caller's;
    /// a buffer is too short).
    #[error("tensor {tensor:?}: {reason}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What went wrong.
        reason: String,
    },
}

impl Error {
    /// What kind of failure this is: the classification Python's exception classes and C's
    /// status codes are both derived from.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Load(error) => error.kind(),
            Self::PartialLoad { source, .. } => source.kind(),
            Self::Mismatch { .. } => ErrorKind::Selection,
            Self::Backend { .. } | Self::NotBuilt(_) | Self::NoGpu { .. } => {
                ErrorKind::BackendUnavailable
            }
            Self::InvalidOption { .. } | Self::DeviceMismatch { .. } => ErrorKind::InvalidOption,
            Self::DestinationSpace { .. } => ErrorKind::Destination,
            Self::DeviceCopy { .. } => ErrorKind::Device,
            Self::Tensor { .. } => ErrorKind::Usage,
        }
    }

    /// The file the error is about, where there is one.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            Self::Load(error) => error.file(),
            Self::PartialLoad { source, .. } => source.file(),
            _ => None,
        }
    }

    /// The tensor the error is about, where there is one.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            Self::Load(error) => error.tensor(),
            Self::PartialLoad { source, .. } => source.tensor(),
            Self::DeviceCopy { tensor, .. } | Self::Tensor { tensor, .. } => Some(tensor),
            _ => None,
        }
    }

    /// The longer story behind the one-line message, for `-v`/`--verbose` and logs: each GPU
    /// backend passed over with why for [`Error::NoGpu`]; empty where the message says it all.
    pub fn details(&self) -> &[String] {
        match self {
            Self::NoGpu { passed_over, .. } => passed_over,
            _ => &[],
        }
    }

    #[cfg(any(feature = "cufile", feature = "hipfile"))]
    pub(crate) fn backend(
        backend: &'static str,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            backend,
            source: Box::new(source),
        }
    }

    pub(crate) fn about_tensor(tensor: &str, reason: impl Into<String>) -> Self {
        Self::Tensor {
            tensor: tensor.to_owned(),
            reason: reason.into(),
        }
    }
}

/// A result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
