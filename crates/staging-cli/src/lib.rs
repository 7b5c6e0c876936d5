//! What the `stage` command and the `stage-bench` benchmark share: the load options' flags,
//! generated from the library's one table of keys ([`LoadOptions::KEYS`]) so that every key is
//! a flag (`chunk_size` is `--chunk-size`) and every flag's value goes through the library's
//! one parser ([`LoadOptions::set`]); and the size grammar of every `SIZE` flag.

use clap::{Arg, ArgAction, ArgMatches, Command};
use safetensors_staging::{LoadOptions, ValueKind};

pub use safetensors_staging::{parse_rows, parse_size};

/// The flag a key is spelled as (`chunk_size` → `chunk-size`).
pub fn flag_of(key: &str) -> String {
    key.replace('_', "-")
}

/// `command` with one flag per load option: `--KEY VALUE` (`--direct-io` alone means true;
/// `select`, `rows` and `store-option` repeat). `--device-memory` stays an alias of
/// `--memory-cap`.
pub fn with_load_options(command: Command) -> Command {
    let args = LoadOptions::KEYS.iter().map(|&(key, kind, help)| {
        let arg = Arg::new(key)
            .long(flag_of(key))
            .help(help)
            .help_heading("Load options");
        let arg = match key {
            "memory_cap" => arg.visible_alias("device-memory"),
            _ => arg,
        };
        match kind {
            ValueKind::Bool => arg
                .num_args(0..=1)
                .default_missing_value("true")
                .value_name("BOOL")
                .action(ArgAction::Set),
            ValueKind::Repeated => arg
                .value_name(match key {
                    "rows" => "GLOB=SPEC",
                    "store_option" => "KEY=VALUE",
                    "allow_redirect" => "HOST",
                    _ => "GLOB",
                })
                .action(ArgAction::Append),
            ValueKind::Size => arg.value_name("SIZE").action(ArgAction::Set),
            ValueKind::Count => arg.value_name("N").action(ArgAction::Set),
            ValueKind::Path => arg.value_name("PATH").action(ArgAction::Set),
            _ => arg.value_name(key.to_uppercase()).action(ArgAction::Set),
        }
    });
    command.args(args)
}

/// The load options the flags of [`with_load_options`] give, each value through
/// [`LoadOptions::set`] (repeated flags in the order given).
pub fn load_options(matches: &ArgMatches) -> Result<LoadOptions, safetensors_staging::Error> {
    let mut options = LoadOptions::new();
    for &(key, ..) in LoadOptions::KEYS {
        // `try_get_many`: an id this command never defined (a caller's own) is simply absent.
        if let Ok(Some(values)) = matches.try_get_many::<String>(key) {
            for value in values {
                options.set(key, value)?;
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
        for &(key, kind, _) in LoadOptions::KEYS {
            let flag = format!("--{}", flag_of(key));
            let value = match (kind, key) {
                (_, "backend") => "host",
                (_, "device") => "cuda:2",
                (_, "cufile_mode") => "posix",
                (_, "hipfile_mode") => "hipfile",
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
        assert!(error.contains("option chunk_size=\"lots\""), "{error}");
    }
}
