//! The read modes as callers spell them, one enum per library: the one place their names
//! (`auto`, `gds`, `compat`, `posix` for cuFile; `auto`, `hipfile`, `posix` for hipFile) are
//! written. Each turns into the shared [`RequestedMode`] the reader runs by.

use std::fmt;
use std::str::FromStr;

use crate::RequestedMode;

/// Writes the `FromStr`, `Display` and name list of a mode enum from its one table of
/// `(variant, name)` pairs.
macro_rules! mode_names {
    ($mode:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $mode {
            /// Every mode, in the order the documentation lists them.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
            /// Every mode's name, in the order of [`ALL`](Self::ALL).
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The mode's name, as every door spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }
        }

        impl FromStr for $mode {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, String> {
                match text.trim() {
                    $($name => Ok(Self::$variant),)+
                    _ => Err(format!("expected {}", spelled_list(Self::NAMES))),
                }
            }
        }

        impl fmt::Display for $mode {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// `a, b or c`.
fn spelled_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// How the cuFile backend reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CufileMode {
    /// GDS if nvidia-fs is loaded, else cuFile's compatibility mode, else POSIX.
    #[default]
    Auto,
    /// GPUDirect Storage only.
    Gds,
    /// cuFile's compatibility mode.
    Compat,
    /// No libcufile: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

mode_names!(CufileMode {
    Auto => "auto",
    Gds => "gds",
    Compat => "compat",
    Posix => "posix",
});

impl From<CufileMode> for RequestedMode {
    fn from(mode: CufileMode) -> Self {
        match mode {
            CufileMode::Auto => Self::Auto,
            CufileMode::Gds => Self::Fast,
            CufileMode::Compat => Self::Compat,
            CufileMode::Posix => Self::Posix,
        }
    }
}

/// How the hipFile backend reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HipfileMode {
    /// hipFile (its fastpath or its own fallback); per file POSIX when a file cannot be
    /// registered.
    #[default]
    Auto,
    /// hipFile only.
    Hipfile,
    /// No libhipfile: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

mode_names!(HipfileMode {
    Auto => "auto",
    Hipfile => "hipfile",
    Posix => "posix",
});

impl From<HipfileMode> for RequestedMode {
    fn from(mode: HipfileMode) -> Self {
        match mode {
            HipfileMode::Auto => Self::Auto,
            HipfileMode::Hipfile => Self::Fast,
            HipfileMode::Posix => Self::Posix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_mode() {
        for &mode in CufileMode::ALL {
            assert_eq!(mode.as_str().parse::<CufileMode>(), Ok(mode));
            assert_eq!(format!(" {mode} ").parse::<CufileMode>(), Ok(mode));
        }
        for &mode in HipfileMode::ALL {
            assert_eq!(mode.as_str().parse::<HipfileMode>(), Ok(mode));
        }
        assert_eq!(
            CufileMode::ALL
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>(),
            CufileMode::NAMES
        );
        assert_eq!(
            HipfileMode::ALL
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>(),
            HipfileMode::NAMES
        );
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        assert_eq!(
            "fast".parse::<CufileMode>(),
            Err("expected auto, gds, compat or posix".to_owned())
        );
        assert_eq!(
            "gds".parse::<HipfileMode>(),
            Err("expected auto, hipfile or posix".to_owned())
        );
    }

    #[test]
    fn modes_are_the_reader_s_requested_modes() {
        assert_eq!(RequestedMode::from(CufileMode::Gds), RequestedMode::Fast);
        assert_eq!(
            RequestedMode::from(CufileMode::Compat),
            RequestedMode::Compat
        );
        assert_eq!(
            RequestedMode::from(HipfileMode::Hipfile),
            RequestedMode::Fast
        );
        assert_eq!(
            RequestedMode::from(HipfileMode::Posix),
            RequestedMode::Posix
        );
        assert_eq!(
            RequestedMode::from(CufileMode::default()),
            RequestedMode::default()
        );
        assert_eq!(
            RequestedMode::from(HipfileMode::default()),
            RequestedMode::default()
        );
    }
}
