//! The Hub where deployments take it, against the fake Hub (`FakeHub`), as `huggingface_hub`
//! 2.4 behaves there (`shared/reference/hub.md`, "Where deployments take it"; the Python suite
//! runs `huggingface_hub` itself on the same cases): a mirror addressed with a path, the Hub
//! down or rate-limiting while the model is cached, a new commit that leaves the weights alone,
//! a renamed repository, and a storage redirect that goes on to another host.

use backend_mock::hub::{HubFaults, Server};

use super::hub::{Fixture, Options, REPO, assert_exact, cdn_requests, fixture};

/// The weight bytes the CDN sent (the sum of the ranges of its `GET`s).
fn cdn_bytes(f: &Fixture) -> u64 {
    cdn_requests(&f.hub.log())
        .iter()
        .filter(|l| l.method == "GET" && l.status / 100 == 2)
        .filter_map(|l| l.range.map(|(a, b)| b - a + 1))
        .sum()
}

#[test]
fn a_mirror_addressed_with_a_path_serves_every_request_under_it() {
    // Artifactory and Nexus put the Hub under a path: every URL is the endpoint followed by the
    // route, the prefix exactly once (the weights' too).
    let f = fixture();
    f.hub.set_prefix("/api/huggingfaceml/hf");
    let (loaded, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let log = f.hub.log();
    let hub: Vec<_> = log.iter().filter(|l| l.server == Server::Hub).collect();
    assert!(!hub.is_empty());
    for request in hub {
        assert!(
            request.path.starts_with("/api/huggingfaceml/hf/")
                && !request.path["/api/huggingfaceml/hf".len()..].contains("/api/huggingfaceml"),
            "{request:?}"
        );
        assert!(request.status < 400, "{request:?}");
    }
}

#[test]
fn the_hub_down_or_rate_limiting_serves_a_cached_model() {
    for status in [500, 502, 503, 504, 429] {
        let f = fixture();
        let (_, error, _) = f.load("hf://org/tiny", f.options());
        assert!(error.is_none(), "{error:?}");
        f.hub.set_faults(HubFaults {
            outage: Some(status),
            ..HubFaults::default()
        });
        f.hub.clear_log();
        let (loaded, error, load) = f.load("hf://org/tiny", f.options());
        assert!(error.is_none(), "{status}: {error:?}");
        assert_exact(&loaded, &f.contents);
        assert_eq!(load.unwrap().report().mode.as_str(), "posix", "{status}");
        assert_eq!(cdn_bytes(&f), 0, "{status}");
        // Not in the cache: the Hub's answer, in words.
        let message = f.load("hf://org/other", f.options()).1.unwrap().to_string();
        assert!(message.contains(&format!("answered {status}")), "{message}");
    }
}

#[test]
fn a_renamed_repository_is_followed_to_its_new_name() {
    // The Hub answers the old name with a 307 to the new (a relative `Location`); the cache is
    // the name asked for, as `huggingface_hub` writes it.
    let f = fixture();
    f.hub.rename(REPO, "new-org/tiny");
    let (loaded, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let log = f.hub.log();
    assert!(log.iter().any(|l| l.status == 307), "{log:#?}");
    assert!(f.repo_dir().join("refs/main").is_file());
}

#[test]
fn a_tree_listed_in_pages_is_read_to_its_last_page() {
    // One entry a page: the revision's files come from following every `Link` (the Hub pages a
    // long listing); a load reads the shards of all of them.
    let f = fixture();
    f.hub.set_tree_page(1);
    let (loaded, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let pages = f
        .hub
        .log()
        .iter()
        .filter(|l| l.path.contains("/tree/"))
        .count();
    assert!(
        pages >= f.files.len(),
        "{pages} pages for {} files",
        f.files.len()
    );
}

#[test]
fn a_second_storage_hop_to_another_host_needs_allowing_and_is_reported() {
    let f = fixture();
    f.hub.set_faults(HubFaults {
        cdn_hop: Some("localhost".into()),
        ..HubFaults::default()
    });
    // Not allowed: refused, naming the host it would have gone to.
    let mut options = f.options();
    options.hub.cache = false;
    let message = f
        .load("hf://org/tiny", options.clone())
        .1
        .unwrap()
        .to_string();
    assert!(message.contains("localhost"), "{message}");
    // Allowed by name: followed, and both hops reported.
    options.remote.allow_redirects = vec!["localhost".into()];
    let (loaded, error, load) = f.load("hf://org/tiny", options);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    let redirects = load.unwrap().report().redirects;
    let cdn = f.hub.cdn().trim_start_matches("http://").to_owned();
    let port = cdn.rsplit(':').next().unwrap().to_owned();
    assert!(
        redirects.iter().any(|r| r.ends_with(&format!("-> {cdn}"))),
        "{redirects:?}"
    );
    assert!(
        redirects
            .iter()
            .any(|r| r.ends_with(&format!("-> localhost:{port}"))),
        "{redirects:?}"
    );
}

/// The fixture's files with `changes` (name, new bytes) applied, as a new commit's snapshot.
fn changed(f: &Fixture, changes: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    f.files
        .iter()
        .map(|(name, bytes)| {
            let new = changes
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, b)| b.clone());
            (name.clone(), new.unwrap_or_else(|| bytes.clone()))
        })
        .collect()
}

fn commit(f: &Fixture, files: &[(String, Vec<u8>)]) -> String {
    let borrowed: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    f.hub.add_commit(REPO, &borrowed)
}

#[test]
fn a_new_commit_that_leaves_the_weights_alone_downloads_no_weight_byte() {
    let f = fixture();
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    let next = commit(
        &f,
        &changed(
            &f,
            &[("config.json", br#"{"model_type":"tinier"}"#.to_vec())],
        ),
    );
    f.hub.clear_log();
    let (loaded, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(cdn_bytes(&f), 0, "{:#?}", f.hub.log());
    // A local load of the new snapshot, every weight linked to the blob already there; the
    // report says so: the new commit, the config alone downloaded and written.
    let report = load.unwrap().report();
    assert_eq!(report.mode.as_str(), "posix");
    let hub = report.hub.unwrap();
    assert_eq!((hub.commit.as_str(), hub.cached), (next.as_str(), true));
    let config = br#"{"model_type":"tinier"}"#.len() as u64;
    assert_eq!((hub.bytes_downloaded, hub.bytes_written), (config, config));
    assert_eq!(hub.bytes_from_cache, report.bytes_read);
    assert_eq!(
        std::fs::read_to_string(f.repo_dir().join("refs/main")).unwrap(),
        next
    );
    for (name, _) in &f.files {
        if name == "pytorch_model.bin" {
            continue;
        }
        let link = f.repo_dir().join("snapshots").join(&next).join(name);
        assert!(std::fs::read_link(&link).is_ok(), "{name} not linked");
    }
    let config = f
        .repo_dir()
        .join("snapshots")
        .join(&next)
        .join("config.json");
    assert_eq!(
        std::fs::read(config).unwrap(),
        br#"{"model_type":"tinier"}"#
    );
}

#[test]
fn a_new_commit_changing_one_shard_downloads_that_shard_alone() {
    let f = fixture();
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    // The second shard's tensors rewritten (same names, shapes and offsets, other bytes).
    let shard = "model-00002-of-00002.safetensors";
    let mut bytes = f.bytes_of(shard).to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    let next = commit(&f, &changed(&f, &[(shard, bytes.clone())]));
    f.hub.clear_log();
    let (loaded, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    assert_eq!(loaded.len(), f.contents.len());
    assert_eq!(cdn_bytes(&f), bytes.len() as u64, "{:#?}", f.hub.log());
    // The report: the changed shard downloaded and written, the other and the index read
    // from the cache.
    let hub = load.unwrap().report().hub.unwrap();
    assert_eq!((hub.commit.as_str(), hub.cached), (next.as_str(), false));
    let changed_len = bytes.len() as u64;
    assert_eq!(
        (hub.bytes_downloaded, hub.bytes_written),
        (changed_len, changed_len)
    );
    let untouched = f.bytes_of("model-00001-of-00002.safetensors").len()
        + f.bytes_of("model.safetensors.index.json").len();
    assert_eq!(hub.bytes_from_cache, untouched as u64);
    let cached = f.repo_dir().join("snapshots").join(&next).join(shard);
    assert_eq!(std::fs::read(cached).unwrap(), bytes);
}

#[test]
fn a_cold_load_asks_for_the_index_once_and_reports_what_it_read() {
    let f = fixture();
    let (_, error, load) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    let hub = load.unwrap().report().hub.unwrap();
    assert_eq!(
        (
            hub.repo.as_str(),
            hub.revision.as_str(),
            hub.commit.as_str()
        ),
        (REPO, "main", f.commit.as_str())
    );
    assert_eq!(
        hub.files,
        [
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"
        ]
    );
    assert_eq!(
        hub.snapshot.as_deref(),
        Some(f.repo_dir().join("snapshots").join(&f.commit).as_path())
    );
    // Every file fetched came over the network and went into the cache once: the small files
    // and the weights (not the other format's).
    let fetched: u64 = f
        .files
        .iter()
        .filter(|(name, _)| name != "pytorch_model.bin")
        .map(|(_, bytes)| bytes.len() as u64)
        .sum();
    assert_eq!(
        (hub.bytes_downloaded, hub.bytes_written),
        (fetched, fetched)
    );
    assert_eq!(hub.bytes_from_cache, 0);
    let gets = f
        .hub
        .log()
        .iter()
        .filter(|l| l.method == "GET" && l.path.ends_with("model.safetensors.index.json"))
        .count();
    assert_eq!(gets, 1, "{:#?}", f.hub.log());
}

/// Makes every folder under `dir` immutable (`chattr +i`, which binds root too) or mutable
/// again; whether it could.
fn immutable(dir: &std::path::Path, on: bool) -> bool {
    let flag = if on { "+i" } else { "-i" };
    std::process::Command::new("chattr")
        .args(["-R", flag])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_complete_read_only_cache_without_locks_loads_as_it_is() {
    // A copied or mounted model volume: the snapshot complete, no `.locks/`, nothing writable.
    let f = fixture();
    let (_, error, _) = f.load("hf://org/tiny", f.options());
    assert!(error.is_none(), "{error:?}");
    std::fs::remove_dir_all(f.cache.path().join(".locks")).unwrap();
    let before = super::hub::tree(f.cache.path());
    // Where the file system lets even root be refused (ext4, xfs: `chattr +i`), the cache is
    // made read-only; elsewhere the test still sees that nothing was written.
    let read_only = immutable(f.cache.path(), true);
    f.hub.clear_log();
    let result = f.load("hf://org/tiny", f.options());
    if read_only {
        immutable(f.cache.path(), false);
    }
    let (loaded, error, load) = result;
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &f.contents);
    assert_eq!(load.unwrap().report().mode.as_str(), "posix");
    assert_eq!(cdn_bytes(&f), 0);
    assert_eq!(super::hub::tree(f.cache.path()), before, "nothing written");
    assert!(!f.cache.path().join(".locks").exists());
}

#[test]
fn what_changed_between_two_revisions_is_known_online_and_offline() {
    let f = fixture();
    let shard = "model-00002-of-00002.safetensors";
    let mut bytes = f.bytes_of(shard).to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    let next = commit(&f, &changed(&f, &[(shard, bytes)]));
    let changes = |options: Options| {
        safetensors_staging::remote::hub::changes(
            std::path::Path::new("hf://org/tiny"),
            &f.commit,
            &options.remote,
            &options.hub,
        )
        .unwrap()
    };
    let online = changes(f.options());
    assert_eq!(
        (online.commit.as_str(), online.since.as_str()),
        (next.as_str(), f.commit.as_str())
    );
    assert_eq!(online.changed, [shard]);
    assert_eq!(online.path, format!("hf://org/tiny@{next}"));
    // Offline, from the cache's snapshots of both commits (each loaded once).
    for revision in [f.commit.as_str(), "main"] {
        let (_, error, _) = f.load(&format!("hf://org/tiny@{revision}"), f.options());
        assert!(error.is_none(), "{error:?}");
    }
    let mut offline = f.options();
    offline.hub.offline = Some(true);
    f.hub.clear_log();
    let cached = changes(offline);
    assert!(f.hub.log().is_empty(), "no request offline");
    assert_eq!(cached.commit, next);
    // The snapshots hold only what loads fetched: the same weights differ, and nothing else.
    assert!(
        cached.changed.contains(&shard.to_owned()),
        "{:?}",
        cached.changed
    );
    assert!(
        !cached
            .changed
            .contains(&"model-00001-of-00002.safetensors".to_owned())
    );
}
