//! `stage --help` against the library's table of load options: every key's flag, each alias's
//! flag, and the key's help, default and choices are listed, so the command cannot drift from
//! the table (or from `docs/reference/options.md`, rendered from the same table).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::process::Command;

use safetensors_staging::LoadOptions;

/// `stage --help`, with its lines joined so that a wrapped help reads as one text.
fn help() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_stage"))
        .arg("--help")
        // No terminal width to wrap at.
        .env("COLUMNS", "1000")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn help_lists_every_key_with_its_aliases_help_and_default() {
    let help = help();
    for spec in LoadOptions::specs() {
        let flag = format!("--{} <{}>", spec.flag(), spec.value_name());
        let flag = if help.contains(&flag) {
            flag
        } else {
            // A boolean's value is optional: `--direct-io [<BOOL>]`.
            format!("--{} [<{}>]", spec.flag(), spec.value_name())
        };
        assert!(
            help.contains(&flag),
            "{flag} is not in stage --help:\n{help}"
        );
        for alias in spec.flag_aliases() {
            assert!(
                help.contains(&format!("--{alias}")),
                "--{alias} (an alias of --{}) is not in stage --help",
                spec.flag()
            );
        }
        let line = staging_cli::help_of(spec);
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains(&line),
            "{}: {line:?} is not in stage --help",
            spec.name()
        );
        assert!(line.contains(&format!("[default: {}]", spec.default())));
        for choice in spec.choices() {
            assert!(line.contains(choice), "{}: {choice}", spec.name());
        }
    }
}

#[test]
fn an_alias_flag_sets_its_key() {
    for spec in LoadOptions::specs() {
        for alias in spec.flag_aliases() {
            let command = staging_cli::with_load_options(clap::Command::new("stage"));
            let value = match spec.kind() {
                safetensors_staging::ValueKind::Size => "1GiB",
                safetensors_staging::ValueKind::Count => "3",
                safetensors_staging::ValueKind::Bool => "false",
                _ => spec.choices().first().copied().unwrap_or("x"),
            };
            let by_alias = command
                .clone()
                .try_get_matches_from(["stage", &format!("--{alias}"), value])
                .unwrap();
            let by_flag = command
                .try_get_matches_from(["stage", &format!("--{}", spec.flag()), value])
                .unwrap();
            assert_eq!(
                staging_cli::load_options(&by_alias).unwrap(),
                staging_cli::load_options(&by_flag).unwrap(),
                "--{alias}"
            );
        }
    }
}
