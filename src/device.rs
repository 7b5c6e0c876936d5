//! [`Device`]: where a load's tensors go, as every door spells it (`auto`, `cpu`, `cuda:N`,
//! `hip:N`, an index). Its own module, below both the options and the backend choice that
//! read it.

use std::fmt;
use std::str::FromStr;

/// Where the tensors go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Device {
    /// A GPU when one is usable (cuFile, then hipFile, on GPU 0), else host memory; the report's
    /// `passed_over` says why each GPU backend was not used. Spelled `auto`.
    #[default]
    Auto,
    /// Host memory (the host backend). Spelled `cpu`.
    Cpu,
    /// GPU `n`, through whichever GPU backend runs (cuFile, then hipFile: torch calls ROCm
    /// GPUs `cuda` too); none usable is an error naming what was passed over. Spelled `cuda`
    /// (GPU 0), `cuda:N`, or `N`.
    Gpu(usize),
    /// HIP GPU `n`, through hipFile only. Spelled `hip` (GPU 0) or `hip:N`.
    Hip(usize),
}

impl Device {
    /// The GPU ordinal, when a GPU was asked for.
    pub fn gpu_index(self) -> Option<usize> {
        match self {
            Self::Gpu(n) | Self::Hip(n) => Some(n),
            Self::Auto | Self::Cpu => None,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Gpu(n) => write!(f, "cuda:{n}"),
            Self::Hip(n) => write!(f, "hip:{n}"),
        }
    }
}

impl From<usize> for Device {
    /// GPU `index` (any GPU backend).
    fn from(index: usize) -> Self {
        Self::Gpu(index)
    }
}

impl FromStr for Device {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let index = |n: &str| {
            n.parse::<usize>()
                .map_err(|_| format!("{n:?} is not a GPU ordinal"))
        };
        Ok(match text {
            "auto" => Self::Auto,
            "cpu" => Self::Cpu,
            "cuda" => Self::Gpu(0),
            "hip" => Self::Hip(0),
            _ => match text.split_once(':') {
                Some(("cuda", n)) => Self::Gpu(index(n)?),
                Some(("hip", n)) => Self::Hip(index(n)?),
                None if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() => {
                    Self::Gpu(index(text)?)
                }
                _ => return Err("expected auto, cpu, cuda, cuda:N, hip, hip:N or N".into()),
            },
        })
    }
}
