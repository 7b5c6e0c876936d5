//! The fake Hub driven from another process: one JSON command per line in, one JSON answer per
//! line out (`examples/fake_hub.rs` reads them from its stdin; the Python tests' `fakehub.py`
//! writes them). The commands are the [`FakeHub`](super::FakeHub) methods:
//!
//! | `op` | fields | answer |
//! | --- | --- | --- |
//! | `endpoints` | | `{"endpoint", "cdn"}` |
//! | `add_repo` | `repo`, `files` (path -> base64) or `dir`, `revisions`, `gated`, `private` | the commit |
//! | `add_commit` | `repo`, `files` or `dir` | the commit |
//! | `tag` | `repo`, `name`, `commit` | `null` |
//! | `faults` | `set`: fields of [`HubFaults`](super::HubFaults), merged into those in force | the faults now |
//! | `set_rate` | `rate` (bytes per second, `null`: none) | `null` |
//! | `set_prefix` | `prefix` | `null` |
//! | `rename` | `old`, `new` | `null` |
//! | `set_tree_page` | `entries` | `null` |
//! | `log` | | the log ([`HubLogged`](super::HubLogged)s) |
//! | `clear_log` | | `null` |
//!
//! An answer is `{"ok": value}` or `{"error": "what was wrong"}`; a command that cannot be read
//! (not JSON, an unknown `op` or field) is an error answer, never a stop.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{FakeHub, HubFaults};

/// One command.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Command {
    Endpoints,
    AddRepo {
        repo: String,
        /// Path -> bytes in base64 (or `dir`).
        files: Option<BTreeMap<String, String>>,
        /// A directory to read the files of.
        dir: Option<PathBuf>,
        /// Branches and tags pointed at the commit besides `main`.
        #[serde(default)]
        revisions: Vec<String>,
        gated: Option<Vec<String>>,
        private: Option<Vec<String>>,
    },
    AddCommit {
        repo: String,
        files: Option<BTreeMap<String, String>>,
        dir: Option<PathBuf>,
    },
    Tag {
        repo: String,
        name: String,
        commit: String,
    },
    Faults {
        /// Fields of [`HubFaults`] to change.
        set: serde_json::Map<String, Value>,
    },
    SetRate {
        rate: Option<u64>,
    },
    SetPrefix {
        prefix: String,
    },
    Rename {
        old: String,
        new: String,
    },
    SetTreePage {
        entries: usize,
    },
    Log,
    ClearLog,
}

fn strs(tokens: &[String]) -> Vec<&str> {
    tokens.iter().map(String::as_str).collect()
}

impl FakeHub {
    /// Runs one command line of the control protocol (see the module's table) and returns its
    /// answer line (without the newline).
    pub fn control(&self, line: &str) -> String {
        let answer = match serde_json::from_str::<Command>(line) {
            Ok(command) => self.run(command),
            Err(e) => Err(format!("not a command: {e}")),
        };
        match answer {
            Ok(value) => json!({ "ok": value }),
            Err(error) => json!({ "error": error }),
        }
        .to_string()
    }

    fn run(&self, command: Command) -> Result<Value, String> {
        match command {
            Command::Endpoints => Ok(json!({ "endpoint": self.endpoint(), "cdn": self.cdn() })),
            Command::AddRepo {
                repo,
                files,
                dir,
                revisions,
                gated,
                private,
            } => {
                let commit = self.commit(&repo, files, dir, true)?;
                for name in &revisions {
                    self.tag(&repo, name, &commit).map_err(|e| e.to_string())?;
                }
                if let Some(tokens) = gated {
                    self.gate(&repo, &strs(&tokens));
                }
                if let Some(tokens) = private {
                    self.make_private(&repo, &strs(&tokens));
                }
                Ok(json!(commit))
            }
            Command::AddCommit { repo, files, dir } => {
                Ok(json!(self.commit(&repo, files, dir, false)?))
            }
            Command::Tag { repo, name, commit } => {
                self.tag(&repo, &name, &commit).map_err(|e| e.to_string())?;
                Ok(Value::Null)
            }
            Command::Faults { set } => {
                let mut now = serde_json::to_value(self.faults()).map_err(|e| e.to_string())?;
                if let Value::Object(fields) = &mut now {
                    fields.extend(set);
                }
                let faults: HubFaults =
                    serde_json::from_value(now).map_err(|e| format!("bad faults: {e}"))?;
                self.set_faults(faults);
                serde_json::to_value(self.faults()).map_err(|e| e.to_string())
            }
            Command::SetRate { rate } => {
                self.set_rate(rate);
                Ok(Value::Null)
            }
            Command::SetPrefix { prefix } => {
                self.set_prefix(&prefix);
                Ok(Value::Null)
            }
            Command::Rename { old, new } => {
                self.rename(&old, &new);
                Ok(Value::Null)
            }
            Command::SetTreePage { entries } => {
                self.set_tree_page(entries);
                Ok(Value::Null)
            }
            Command::Log => serde_json::to_value(self.log()).map_err(|e| e.to_string()),
            Command::ClearLog => {
                self.clear_log();
                Ok(Value::Null)
            }
        }
    }

    fn commit(
        &self,
        repo: &str,
        files: Option<BTreeMap<String, String>>,
        dir: Option<PathBuf>,
        new_repo: bool,
    ) -> Result<String, String> {
        match (files, dir) {
            (Some(files), None) => {
                let engine = base64::engine::general_purpose::STANDARD;
                let decoded = files
                    .iter()
                    .map(|(path, text)| {
                        engine
                            .decode(text)
                            .map(|bytes| (path.as_str(), bytes))
                            .map_err(|e| format!("{path}: not base64: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(if new_repo {
                    self.add_repo(repo, &decoded)
                } else {
                    self.add_commit(repo, &decoded)
                })
            }
            (None, Some(dir)) => self
                .commit_dir(repo, &dir, new_repo)
                .map_err(|e| format!("{}: {e}", dir.display())),
            _ => Err("give either files (path -> base64) or dir".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Server;

    fn ok(hub: &FakeHub, line: &str) -> Value {
        let answer: Value = serde_json::from_str(&hub.control(line)).unwrap();
        assert!(answer.get("error").is_none(), "{line}: {answer}");
        answer["ok"].clone()
    }

    fn error(hub: &FakeHub, line: &str) -> String {
        let answer: Value = serde_json::from_str(&hub.control(line)).unwrap();
        answer["error"].as_str().unwrap_or_default().to_owned()
    }

    #[test]
    fn every_command_does_what_its_method_does() {
        let hub = FakeHub::start().unwrap();
        let endpoints = ok(&hub, r#"{"op": "endpoints"}"#);
        assert_eq!(endpoints["endpoint"], hub.endpoint());
        assert_eq!(endpoints["cdn"], hub.cdn());
        // {"config.json": "{}"} in base64.
        let commit = ok(
            &hub,
            r#"{"op": "add_repo", "repo": "org/m", "files": {"config.json": "e30="},
                "revisions": ["v1"], "gated": ["good"]}"#,
        );
        let commit = commit.as_str().unwrap().to_owned();
        assert_eq!(commit.len(), 40);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/model.safetensors"), b"weights").unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let line = json!({"op": "add_commit", "repo": "org/m", "dir": dir.path()}).to_string();
        let second = ok(&hub, &line);
        assert_ne!(second.as_str().unwrap(), commit);
        ok(
            &hub,
            &json!({"op": "tag", "repo": "org/m", "name": "v2", "commit": second}).to_string(),
        );
        let faults = ok(
            &hub,
            r#"{"op": "faults", "set": {"truncate": ["a"], "outage": 503}}"#,
        );
        assert_eq!(faults["outage"], 503);
        let faults = ok(&hub, r#"{"op": "faults", "set": {"expire_after": 0}}"#);
        assert_eq!(
            (faults["outage"].clone(), faults["expire_after"].clone()),
            (json!(503), json!(0))
        );
        assert_eq!(hub.faults().truncate, ["a".to_owned()].into());
        ok(&hub, r#"{"op": "faults", "set": {"outage": null}}"#);
        ok(&hub, r#"{"op": "set_rate", "rate": 1000000}"#);
        ok(&hub, r#"{"op": "set_rate", "rate": null}"#);
        ok(&hub, r#"{"op": "set_tree_page", "entries": 2}"#);
        ok(&hub, r#"{"op": "set_prefix", "prefix": "/mirror"}"#);
        assert!(hub.endpoint().ends_with("/mirror"));
        ok(&hub, r#"{"op": "set_prefix", "prefix": ""}"#);
        ok(&hub, r#"{"op": "rename", "old": "org/m", "new": "org/n"}"#);
        // The renamed repo answers under its new name, with its tags, gate and a paged tree.
        let tree = format!("{}/api/models/org/n/tree/v2?recursive=1", hub.endpoint());
        let reply = crate::hub::tests::get(&tree);
        assert_eq!(reply.status, 200);
        let link = reply.header("Link").unwrap_or_default();
        assert!(link.ends_with("cursor=page-2>; rel=\"next\""), "{link}");
        let log = ok(&hub, r#"{"op": "log"}"#);
        assert_eq!(log[0]["server"], "hub");
        assert_eq!(log[0]["path"], "/api/models/org/n/tree/v2");
        assert!(log[0]["sent"].as_u64().unwrap() > 0);
        assert_eq!(hub.log()[0].server, Server::Hub);
        ok(&hub, r#"{"op": "clear_log"}"#);
        assert!(hub.log().is_empty());
    }

    #[test]
    fn a_bad_command_is_an_error_answer() {
        let hub = FakeHub::start().unwrap();
        assert!(error(&hub, "not json").starts_with("not a command"));
        assert!(error(&hub, r#"{"op": "reboot"}"#).contains("unknown variant"));
        assert!(
            error(&hub, r#"{"op": "faults", "set": {"outrage": 1}}"#).contains("unknown field")
        );
        assert!(error(&hub, r#"{"op": "add_repo", "repo": "a"}"#).contains("either files"));
        let bad = r#"{"op": "add_repo", "repo": "a", "files": {"x": "%%"}}"#;
        assert!(error(&hub, bad).contains("x: not base64"));
        let missing = r#"{"op": "add_repo", "repo": "a", "dir": "/nonexistent/dir"}"#;
        assert!(error(&hub, missing).contains("/nonexistent/dir"));
        let tag = r#"{"op": "tag", "repo": "a", "name": "v", "commit": "0"}"#;
        assert!(error(&hub, tag).contains("no repo a"));
        assert!(hub.log().is_empty());
    }
}
