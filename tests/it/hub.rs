//! Models on the Hugging Face Hub (`hf://org/name`) through the one entry point, against a fake
//! Hub on loopback (`backend_mock::hub::FakeHub`: the revision and tree API, `resolve` with its
//! redirect of LFS files to a signed-URL "CDN" on another port, gated and private repositories,
//! the Hub's error codes, and faults). Each test checks the bytes handed out, the requests each
//! server saw (and that the CDN never saw the token), what the Hugging Face cache holds
//! afterwards (byte for byte, as `huggingface_hub` lays it out: `crates/staging-py/tests/
//! hub/test_hub.py` checks it with `huggingface_hub` itself) and the error.
//!
//! Length: one test per behaviour of a Hub load against one fake Hub and its helpers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use backend_mock::fixtures::{Contents, TensorSpec, write_sharded};
use backend_mock::hub::{FakeHub, HubFaults, HubLogged, Server, sha256_hex};
use safetensors_staging::{Error, HostOptions, HubOptions, Load, Loader, RemoteOptions};

const MIB: usize = 1 << 20;

/// Each tensor handed out: name and bytes.
pub(super) type Loaded = Vec<(String, Vec<u8>)>;
pub(super) const REPO: &str = "org/tiny";

/// What a load from the fake Hub is given: the remote reader's options and the Hub's.
#[derive(Debug, Clone)]
pub(super) struct Options {
    pub(super) remote: RemoteOptions,
    pub(super) hub: HubOptions,
}

/// A fake Hub serving one sharded model: index, two shards, config files and a weight of
/// another format that a load must not fetch.
pub(super) struct Fixture {
    pub(super) hub: FakeHub,
    pub(super) files: Vec<(String, Vec<u8>)>,
    pub(super) contents: Contents,
    pub(super) commit: String,
    pub(super) cache: tempfile::TempDir,
}

pub(super) fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let sharded = write_sharded(
        dir.path(),
        &[
            vec![
                TensorSpec::bytes("embed", 3 * MIB + 17),
                TensorSpec::bytes("small", 100),
            ],
            vec![
                TensorSpec::bytes("layer.weight", 2 * MIB),
                TensorSpec::bytes("tail", 12345),
            ],
        ],
        7,
    )
    .unwrap();
    let mut files: Vec<(String, Vec<u8>)> = sharded
        .files
        .iter()
        .chain([&sharded.index])
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(p).unwrap())
        })
        .collect();
    files.push(("config.json".into(), br#"{"model_type":"tiny"}"#.to_vec()));
    files.push((
        "1_Pooling/config.json".into(),
        br#"{"pooling":"mean"}"#.to_vec(),
    ));
    files.push(("pytorch_model.bin".into(), vec![9u8; 4096]));
    let hub = FakeHub::start().unwrap();
    let borrowed: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let commit = hub.add_repo(REPO, &borrowed);
    Fixture {
        hub,
        files,
        contents: sharded.contents,
        commit,
        cache: tempfile::tempdir().unwrap(),
    }
}

impl Fixture {
    pub(super) fn options(&self) -> Options {
        let mut options = Options {
            remote: RemoteOptions::default(),
            hub: HubOptions::default(),
        };
        options.remote.retry_backoff = std::time::Duration::from_millis(5);
        options.remote.max_retries = 3;
        options.remote.range_size = MIB;
        options.hub.endpoint = Some(self.hub.endpoint());
        options.hub.cache_dir = Some(self.cache.path().to_path_buf());
        options.hub.offline = Some(false);
        options
    }

    pub(super) fn loader(&self, options: Options) -> Loader<'static> {
        Loader::new()
            .backend(safetensors_staging::Backend::Host(HostOptions::default()))
            .remote(options.remote)
            .hub(options.hub)
    }

    pub(super) fn load(
        &self,
        path: &str,
        options: Options,
    ) -> (Loaded, Option<Error>, Option<Load<'static>>) {
        match self.loader(options).open(path) {
            Ok(mut load) => {
                let (loaded, error) = drain(&mut load);
                (loaded, error, Some(load))
            }
            Err(e) => (Vec::new(), Some(e), None),
        }
    }

    pub(super) fn repo_dir(&self) -> PathBuf {
        self.cache.path().join("models--org--tiny")
    }

    pub(super) fn bytes_of(&self, name: &str) -> &[u8] {
        &self.files.iter().find(|(n, _)| n == name).unwrap().1
    }
}

pub(super) fn drain(load: &mut Load<'_>) -> (Loaded, Option<Error>) {
    let mut out = Vec::new();
    for tensor in load.by_ref() {
        match tensor {
            Ok(t) => out.push((t.name().to_owned(), t.to_vec().unwrap())),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

pub(super) fn assert_exact(loaded: &[(String, Vec<u8>)], contents: &Contents) {
    assert_eq!(loaded.len(), contents.len());
    for (name, bytes) in loaded {
        assert!(bytes == &contents[name], "{name}: bytes differ");
    }
}

/// Every file under `dir`, relative, with what it is: `L target` for a link, `F` for a file.
pub(super) fn tree(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&path).unwrap().display()
                ));
            } else if kind.is_dir() {
                stack.push(path);
            } else {
                out.insert(rel);
            }
        }
    }
    out
}

pub(super) fn cdn_requests(log: &[HubLogged]) -> Vec<&HubLogged> {
    log.iter().filter(|l| l.server == Server::Cdn).collect()
}

#[test]
fn a_cold_load_streams_every_byte_and_leaves_the_cache_huggingface_hub_would() {
    let f = fixture();
    let (loaded, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let report = load.unwrap().report();
    assert_eq!(report.mode.as_str(), "remote");
    // Each shard's redirect to the CDN (followed by design) is in the report.
    let cdn_host = f.hub.cdn().trim_start_matches("http://").to_owned();
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        assert!(
            report
                .redirects
                .iter()
                .any(|r| r.contains(shard) && r.ends_with(&format!("-> {cdn_host}"))),
            "{:?}",
            report.redirects
        );
    }

    let log = f.hub.log();
    // The weights came from the CDN, by ranged GETs, and the CDN never saw a token.
    let cdn = cdn_requests(&log);
    assert!(
        cdn.iter()
            .all(|l| l.method == "GET" && l.range.is_some() && l.has_query)
    );
    assert!(cdn.iter().all(|l| l.authorization.is_none()));
    // The weight of another format was never asked for.
    assert!(
        !log.iter().any(|l| l.path.ends_with("pytorch_model.bin")),
        "{log:#?}"
    );

    // The cache: one blob per file (LFS: its SHA-256; else its git blob id), the snapshot's
    // relative links, refs/main, no temporary file left.
    let mut expected = BTreeSet::new();
    for (name, bytes) in &f.files {
        if name == "pytorch_model.bin" {
            continue;
        }
        let blob = if name.ends_with(".safetensors") {
            sha256_hex(bytes)
        } else {
            backend_mock::hub::git_oid(bytes)
        };
        expected.insert(format!("blobs/{blob}"));
        let up = "../".repeat(name.matches('/').count() + 2);
        expected.insert(format!("snapshots/{}/{name} -> {up}blobs/{blob}", f.commit));
        let cached = std::fs::read(f.repo_dir().join("blobs").join(&blob)).unwrap();
        assert!(cached == *bytes, "{name}: the cached blob differs");
    }
    expected.insert("refs/main".into());
    assert_eq!(tree(&f.repo_dir()), expected);
    assert_eq!(
        std::fs::read_to_string(f.repo_dir().join("refs/main")).unwrap(),
        f.commit
    );
    assert!(f.cache.path().join("CACHEDIR.TAG").is_file());
    let locks = tree(&f.cache.path().join(".locks/models--org--tiny"));
    assert!(locks.iter().all(|l| l.ends_with(".lock")) && !locks.is_empty());
}

#[test]
fn a_warm_cache_is_a_local_load_with_no_weight_byte_over_the_network() {
    let f = fixture();
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    f.hub.clear_log();
    let (loaded, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(
        load.unwrap().report().mode.as_str(),
        "posix",
        "a local load"
    );
    let log = f.hub.log();
    assert!(cdn_requests(&log).is_empty(), "{log:#?}");
    // Only the API: the revision's commit and the file listing.
    assert!(log.iter().all(|l| l.path.starts_with("/api/")), "{log:#?}");

    // A small file missing from the cache (one `huggingface_hub` never fetched) that cannot be
    // fetched now: the weights are still read locally.
    let pooling = f
        .repo_dir()
        .join("snapshots")
        .join(&f.commit)
        .join("1_Pooling/config.json");
    std::fs::remove_file(&pooling).unwrap();
    f.hub.set_faults(HubFaults {
        missing: ["1_Pooling/config.json".to_owned()].into(),
        ..f.hub.faults()
    });
    f.hub.clear_log();
    let (loaded, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(load.unwrap().report().mode.as_str(), "posix");
    assert!(cdn_requests(&f.hub.log()).is_empty());
    f.hub.set_faults(HubFaults::default());

    // Offline: not even that.
    f.hub.clear_log();
    let mut offline = f.options();
    offline.hub.offline = Some(true);
    let (loaded, error, _) = f.load("hf://org/tiny", offline);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert!(f.hub.log().is_empty());
}

#[test]
fn an_unreachable_hub_falls_back_to_the_cache_as_huggingface_hub_does() {
    let f = fixture();
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    let mut away = f.options();
    away.hub.endpoint = Some("http://127.0.0.1:9".into());
    away.remote.max_retries = 0;
    let (loaded, error, load) = f.load("hf://org/tiny", away.clone());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(load.unwrap().report().mode.as_str(), "posix");
    // Not in the cache: the transport's words.
    let message = f.load("hf://org/other", away).1.unwrap().to_string();
    assert!(
        message.contains("connection refused by 127.0.0.1:9"),
        "{message}"
    );
}

#[test]
fn offline_without_the_model_in_the_cache_says_so() {
    let f = fixture();
    let mut offline = f.options();
    offline.hub.offline = Some(true);
    let (_, error, _) = f.load("hf://org/tiny", offline);
    let message = error.unwrap().to_string();
    assert!(
        message.contains("HF_HUB_OFFLINE") && message.contains("org/tiny"),
        "{message}"
    );
    assert!(f.hub.log().is_empty());
}

#[test]
fn cache_off_streams_without_writing_anything() {
    let f = fixture();
    let mut options = f.options();
    options.hub.cache = false;
    let (loaded, error, _) = f.load("hf://org/tiny", options);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(std::fs::read_dir(f.cache.path()).unwrap().count(), 0);
    // No small file was fetched either.
    assert!(!f.hub.log().iter().any(|l| l.path.ends_with("config.json")));
}

#[test]
fn a_corrupted_byte_fails_naming_the_file_and_is_never_committed() {
    let f = fixture();
    let shard = "model-00002-of-00002.safetensors";
    f.hub.set_faults(HubFaults {
        corrupt: [(shard.to_owned(), 1000)].into(),
        ..f.hub.faults()
    });
    let (_, error, load) = f.load("hf://org/tiny", f.options());
    let message = error.unwrap().to_string();
    assert!(
        message.contains(shard) && message.contains("SHA-256"),
        "{message}"
    );
    drop(load);
    let blob = sha256_hex(f.bytes_of(shard));
    let left = tree(&f.repo_dir());
    assert!(!left.iter().any(|l| l.contains(&blob)), "{left:#?}");
    assert!(!left.iter().any(|l| l.contains(".incomplete")), "{left:#?}");
}

#[test]
fn an_expired_signed_url_is_asked_for_again() {
    let f = fixture();
    f.hub.set_faults(HubFaults {
        expire_once: true,
        ..f.hub.faults()
    });
    let (loaded, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let log = f.hub.log();
    assert!(cdn_requests(&log).iter().any(|l| l.status == 403));
    let shard = "/org/tiny/resolve";
    let resolves = log
        .iter()
        .filter(|l| l.path.starts_with(shard) && l.path.ends_with("00001-of-00002.safetensors"))
        .count();
    assert!(resolves >= 2, "{log:#?}");
}

#[test]
fn urls_that_always_expire_fail_after_asking_again_a_few_times() {
    let f = fixture();
    f.hub.set_faults(HubFaults {
        expire_after: 0,
        ..f.hub.faults()
    });
    let (_, error, load) = f.load("hf://org/tiny", f.options());
    let message = error.unwrap().to_string();
    assert!(
        message.contains("refused the Hub's signed URL"),
        "{message}"
    );
    drop(load);
    assert!(
        !tree(&f.repo_dir())
            .iter()
            .any(|l| l.contains(".incomplete"))
    );
}

#[test]
fn transient_failures_and_cut_bodies_are_retried() {
    let f = fixture();
    f.hub.set_faults(HubFaults {
        fail_first: true,
        ..f.hub.faults()
    });
    let (loaded, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert!(cdn_requests(&f.hub.log()).iter().any(|l| l.status == 503));

    // A body cut short once: resumed from where it stopped, the bytes exact.
    let once = fixture();
    once.hub.set_faults(HubFaults {
        truncate_first: true,
        ..once.hub.faults()
    });
    let (loaded, error, _) = once.load("hf://org/tiny", once.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &once.contents);
    let log = once.hub.log();
    let cdn = cdn_requests(&log);
    // Each resume asks for the rest of a range: one that starts inside a range asked before.
    let resumed = cdn.iter().any(|later| {
        let Some((a, b)) = later.range else {
            return false;
        };
        cdn.iter().any(|first| {
            first.path == later.path && first.range.is_some_and(|(fa, fb)| fa < a && fb == b)
        })
    });
    assert!(resumed, "{cdn:#?}");

    // A body always cut short: resumed where it stopped, until the retries run out.
    let g = fixture();
    let shard = "model-00001-of-00002.safetensors";
    g.hub.set_faults(HubFaults {
        truncate: [shard.to_owned()].into(),
        ..g.hub.faults()
    });
    let (_, error, load) = g.load("hf://org/tiny", g.options());
    let message = error.unwrap().to_string();
    assert!(
        message.contains(shard) && message.contains("cut short"),
        "{message}"
    );
    drop(load);
    assert!(
        !tree(&g.repo_dir())
            .iter()
            .any(|l| l.contains(".incomplete"))
    );
}

#[test]
fn a_gated_model_needs_a_token_with_access_which_only_the_hub_sees() {
    let f = fixture();
    f.hub.gate(REPO, &["hf_good"]);
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    let message = error.unwrap().to_string();
    assert!(
        message.contains("org/tiny is a gated model") && message.contains("HF_TOKEN"),
        "{message}"
    );
    // Nothing arrived: no snapshot folder, which would be taken for a downloaded model.
    assert!(!f.repo_dir().join("snapshots").exists());
    let mut wrong = f.options();
    wrong.hub.token = Some("hf_bad".into());
    let message = f.load("hf://org/tiny", wrong).1.unwrap().to_string();
    assert!(message.contains("has no access"), "{message}");

    f.hub.clear_log();
    let mut good = f.options();
    good.hub.token = Some("hf_good".into());
    let (loaded, error, _) = f.load("hf://org/tiny", good);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let log = f.hub.log();
    assert!(
        log.iter()
            .filter(|l| l.server == Server::Hub)
            .all(|l| l.authorization.as_deref() == Some("Bearer hf_good"))
    );
    assert!(cdn_requests(&log).iter().all(|l| l.authorization.is_none()));
    assert!(!cdn_requests(&log).is_empty());
}

#[test]
fn missing_models_revisions_and_files_are_named() {
    let f = fixture();
    f.hub.make_private("org/secret", &["hf_x"]);
    for (path, words) in [
        ("hf://org/nothing", "no model org/nothing on the Hub"),
        ("hf://org/tiny@v9", "org/tiny has no revision \"v9\""),
        (
            "hf://org/tiny/nope.safetensors",
            "has no file or folder nope.safetensors",
        ),
        (
            "hf://org/tiny/1_Pooling",
            "no safetensors weights in 1_Pooling",
        ),
        ("hf://org/ti..ny", "not a model id"),
    ] {
        let (_, error, _) = f.load(path, f.options());
        let message = error.unwrap_or_else(|| panic!("{path} loaded")).to_string();
        assert!(message.contains(words), "{path}: {message}");
    }
    f.hub
        .add_repo("org/secret", &[("model.safetensors", vec![0u8; 16])]);
    f.hub.make_private("org/secret", &["hf_x"]);
    let message = f
        .load("hf://org/secret", f.options())
        .1
        .unwrap()
        .to_string();
    assert!(message.contains("or it is private"), "{message}");

    // Listed, but the Hub says it is not there.
    let shard = "model-00002-of-00002.safetensors";
    f.hub.set_faults(HubFaults {
        missing: [shard.to_owned()].into(),
        ..f.hub.faults()
    });
    let message = f.load("hf://org/tiny", f.options()).1.unwrap().to_string();
    assert!(
        message.contains(&format!("has no file {shard}")),
        "{message}"
    );
}

#[test]
fn a_redirect_loop_ends_with_an_error() {
    let f = fixture();
    f.hub.set_faults(HubFaults {
        redirect_loop: ["model-00001-of-00002.safetensors".to_owned()].into(),
        ..f.hub.faults()
    });
    let message = f.load("hf://org/tiny", f.options()).1.unwrap().to_string();
    assert!(
        message.contains("redirected more than 5 times"),
        "{message}"
    );
}

#[test]
fn a_revision_by_tag_or_commit_and_a_file_inside_the_repo() {
    let f = fixture();
    let old = f.commit.clone();
    f.hub.tag(REPO, "v1", &old).unwrap();
    // main moves on; the tag and the commit still name the first one.
    let newer = f.hub.add_commit(
        REPO,
        &[(
            "model.safetensors",
            f.bytes_of("model-00001-of-00002.safetensors").to_vec(),
        )],
    );
    let (loaded, error, _) = f.load("hf://org/tiny@v1", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(
        std::fs::read_to_string(f.repo_dir().join("refs/v1")).unwrap(),
        old
    );
    let (loaded, error, _) = f.load(&format!("hf://org/tiny@{old}"), f.options());
    assert!(error.is_none(), "{error:?}");
    assert_eq!(loaded.len(), f.contents.len());
    // One file of the newer commit.
    let (loaded, error, _) = f.load("hf://org/tiny/model.safetensors", f.options());
    assert!(error.is_none(), "{error:?}");
    let names: BTreeSet<&str> = loaded.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["embed", "small"]));
    assert_eq!(
        std::fs::read_to_string(f.repo_dir().join("refs/main")).unwrap(),
        newer
    );
}

#[test]
fn a_load_of_some_tensors_leaves_no_partial_blob() {
    let f = fixture();
    let load = f
        .loader(f.options())
        .select(safetensors_staging::Selection::names(["small"]))
        .open("hf://org/tiny");
    let mut load = load.unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(loaded.len(), 1);
    drop(load);
    let left = tree(&f.repo_dir());
    assert!(!left.iter().any(|l| l.contains(".incomplete")), "{left:#?}");
    let first = sha256_hex(f.bytes_of("model-00001-of-00002.safetensors"));
    assert!(!left.iter().any(|l| l.contains(&first)), "{left:#?}");
    // The small files are there: a model's config is usable at once.
    assert!(
        f.repo_dir()
            .join("snapshots")
            .join(&f.commit)
            .join("config.json")
            .is_file()
    );
}

#[test]
fn a_selection_reads_only_the_headers_of_the_shards_holding_it() {
    // The index is read first; the streamed load then opens it for the tensors selected, as an
    // `s3://` load does, so the second shard is never asked for, not even its header.
    let f = fixture();
    let mut load = f
        .loader(f.options())
        .select(safetensors_staging::Selection::names(["small"]))
        .open("hf://org/tiny")
        .unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(loaded.len(), 1);
    let report = load.report();
    assert_eq!(report.mode.as_str(), "remote");
    assert_eq!((report.headers_read, report.files), (1, 1));
    let log = f.hub.log();
    assert!(
        log.iter()
            .any(|l| l.path.ends_with("model-00001-of-00002.safetensors")),
        "{log:#?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.path.ends_with("model-00002-of-00002.safetensors")),
        "{log:#?}"
    );
}
