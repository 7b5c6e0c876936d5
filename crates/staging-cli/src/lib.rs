//! What the `stage` command and the `stage-bench` benchmark share: the load options' flags,
//! generated from the library's one table of keys ([`LoadOptions::specs`]) so that every key is
//! a flag (`chunk_size` is `--chunk-size`, its aliases visible aliases: `--device-memory`), its
//! help, default and choices the table's, and every flag's value goes through the library's one
//! parser ([`LoadOptions::set`]); and the size grammar of every `SIZE` flag.

// Feature-gated items are labelled with their feature on docs built with `--cfg docsrs` (CI).
#![cfg_attr(docsrs, feature(doc_cfg))]

use clap::{Arg, ArgAction, ArgMatches, Command};
use safetensors_staging::{LoadOptions, OptionSpec, ValueKind};

pub use safetensors_staging::{parse_rows, parse_size};

/// The flag a key is spelled as (`chunk_size` → `chunk-size`).
pub fn flag_of(key: &str) -> String {
    key.replace('_', "-")
}

/// A key's line of help in `stage --help`: the table's help, then its choices and default.
pub fn help_of(spec: &OptionSpec) -> String {
    let mut help = spec.help().to_owned();
    if !spec.choices().is_empty() {
        help.push_str(&format!(" [values: {}]", spec.choices().join(", ")));
    }
    help.push_str(&format!(" [default: {}]", spec.default()));
    help
}

/// `command` with one flag per load option: `--KEY VALUE` (`--direct-io` alone means true;
/// the repeatable keys, `select`, `rows`, `store-option` and `allow-redirect`, repeat), each
/// alias of the table a visible alias.
pub fn with_load_options(command: Command) -> Command {
    let args = LoadOptions::specs().iter().map(|spec| {
        let arg = Arg::new(spec.name())
            .long(spec.flag())
            .visible_aliases(spec.flag_aliases())
            .help(help_of(spec))
            .value_name(spec.value_name())
            .help_heading("Load options");
        match spec.kind() {
            ValueKind::Bool => arg
                .num_args(0..=1)
                .default_missing_value("true")
                .action(ArgAction::Set),
            ValueKind::Repeated => arg.action(ArgAction::Append),
            _ => arg.action(ArgAction::Set),
        }
    });
    command.args(args)
}

/// The load options the flags of [`with_load_options`] give, each value through
/// [`LoadOptions::set`] (repeated flags in the order given). A value the library refuses is
/// named by its flag (`option --chunk-size="lots": ...`), as the user spelled it.
pub fn load_options(matches: &ArgMatches) -> Result<LoadOptions, safetensors_staging::Error> {
    let mut options = LoadOptions::new();
    for spec in LoadOptions::specs() {
        let key = spec.name();
        // `try_get_many`: an id this command never defined (a caller's own) is simply absent.
        if let Ok(Some(values)) = matches.try_get_many::<String>(key) {
            for value in values {
                options.set(key, value).map_err(|e| match e {
                    safetensors_staging::Error::InvalidOption { value, reason, .. } => {
                        safetensors_staging::Error::InvalidOption {
                            key: format!("--{}", spec.flag()),
                            value,
                            reason,
                        }
                    }
                    other => other,
                })?;
            }
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<LoadOptions, String> {
        let command = with_load_options(Command::new("stage"));
        let matches = command
            .try_get_matches_from(std::iter::once("stage").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        load_options(&matches).map_err(|e| e.to_string())
    }

    #[test]
    fn no_flags_are_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), LoadOptions::new());
    }

    #[test]
    fn every_key_is_a_flag() {
        for spec in LoadOptions::specs() {
            let (key, kind) = (spec.name(), spec.kind());
            let flag = format!("--{}", flag_of(key));
            let value = match (kind, key) {
                (_, "backend") => "host",
                (_, "device") => "cuda:2",
                (_, "cufile_mode") => "posix",
                (_, "hipfile_mode") => "hipfile",
                (_, "map") => "false",
                (_, "rows") => "w=1/2",
                (_, "store_option") => "aws_region=x",
                (_, "allow_redirect") => "cdn.example.com",
                (ValueKind::Bool, _) => "false",
                (ValueKind::Path, _) => "/lib.so",
                (ValueKind::Repeated, _) => "a.*",
                _ => "7",
            };
            let mut expected = LoadOptions::new();
            expected.set(key, value).unwrap();
            assert_eq!(parse(&[&flag, value]).unwrap(), expected, "{flag}");
        }
    }

    #[test]
    fn flags_spell_the_library_s_values() {
        let options = parse(&[
            "--direct-io",
            "--device-memory",
            "1GiB",
            "--select",
            "a.*",
            "--select",
            "b",
            "--rows",
            "a.*=0:2",
        ])
        .unwrap();
        assert!(options.direct_io);
        assert_eq!(options.memory_cap, Some(1 << 30));
        assert_eq!(options.select, ["a.*", "b"]);
        let error = parse(&["--chunk-size", "lots"]).unwrap_err();
        assert!(error.contains("option --chunk-size=\"lots\""), "{error}");
    }
}
