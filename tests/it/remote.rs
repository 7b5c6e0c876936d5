//! Checkpoints read from an HTTP server through the one entry point (`Loader::open` with a URL):
//! a real server on loopback (`backend_mock::http::RangeServer`: HEAD, ranged GET, ETag,
//! If-Match) and a real HTTP client (`object_store`'s). Each test checks the bytes, the
//! requests the server saw, the path each tensor took, what is held afterwards and the error.
//! S3 itself (listing, credentials, buckets) is tested against moto's server in
//! `crates/staging-py/tests/remote/test_remote.py`.
//!
//! Length: one test per behaviour of a URL load against one loopback server and its helpers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::time::{Duration, Instant};

use backend_mock::fixtures::{Contents, TensorSpec, write_file, write_sharded};
use backend_mock::http::{Faults, Logged, RangeServer};
use backend_mock::malformed::{MALFORMED, build};
use safetensors_staging::{
    Backend, Error, HostOptions, Load, Loader, RemoteOptions, StagingPath, StagingPolicy,
};

const MIB: usize = 1 << 20;

/// Small retry backoff, so retried tests stay fast.
fn options() -> RemoteOptions {
    let mut options = RemoteOptions::default();
    options.retry_backoff = Duration::from_millis(5);
    options.max_retries = 3;
    options.range_size = MIB;
    options
}

fn loader(options: RemoteOptions, threads: usize) -> Loader<'static> {
    Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .policy(
            StagingPolicy::builder()
                .io_threads(threads)
                .chunk_size(4 * MIB)
                .build()
                .unwrap(),
        )
        .remote(options)
}

/// Two shards with an index: tensors of several sizes, some spanning several ranges.
fn sharded(server: &RangeServer, prefix: &str) -> (tempfile::TempDir, Contents) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = write_sharded(
        dir.path(),
        &[
            vec![
                TensorSpec::bytes("embed", 3 * MIB + 17),
                TensorSpec::bytes("small.0", 100),
                TensorSpec::bytes("small.1", 4096),
            ],
            vec![
                TensorSpec::bytes("layer.weight", 2 * MIB),
                TensorSpec::bytes("empty", 0),
                TensorSpec::bytes("tail", 12345),
            ],
        ],
        5,
    )
    .unwrap();
    server.put_dir(prefix, dir.path()).unwrap();
    (dir, fixture.contents)
}

/// Each tensor handed out: name, bytes, path.
type Loaded = Vec<(String, Vec<u8>, StagingPath)>;

fn drain(load: &mut Load<'_>) -> (Loaded, Option<Error>) {
    let mut out = Vec::new();
    for tensor in load.by_ref() {
        match tensor {
            Ok(t) => out.push((t.name().to_owned(), t.to_vec().unwrap(), t.path())),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

fn assert_exact(loaded: &Loaded, contents: &Contents) {
    assert_eq!(loaded.len(), contents.len());
    for (name, bytes, _) in loaded {
        assert!(bytes == &contents[name], "{name}: bytes differ");
    }
}

fn gets(log: &[Logged]) -> Vec<&Logged> {
    log.iter().filter(|l| l.method == "GET").collect()
}

#[test]
fn a_sharded_checkpoint_loads_byte_exact_with_ranged_requests_only() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/models/tiny");
    for threads in [1, 3] {
        server.clear_log();
        let mut load = loader(options(), threads)
            .open(server.url("/models/tiny"))
            .unwrap();
        assert_eq!(load.checkpoint().files().len(), 2);
        let (loaded, error) = drain(&mut load);
        assert!(error.is_none(), "{error:?}");
        assert_exact(&loaded, &contents);
        assert!(loaded.iter().all(|(_, _, p)| *p == StagingPath::Device));
        let report = load.report();
        assert_eq!(
            (report.backend.as_str(), report.mode.as_str()),
            ("host", "remote")
        );
        assert_eq!(
            report.bytes_read,
            contents.values().map(|v| v.len() as u64).sum::<u64>()
        );
        drop(load);

        let log = server.log();
        // Every GET is ranged, and none longer than a range; the index was read once, each
        // header with its 8-byte length first.
        for get in gets(&log) {
            let (a, b) = get.range.unwrap_or_else(|| panic!("unranged GET {get:?}"));
            assert!(b - a < MIB as u64, "{get:?} is longer than a range");
            assert_eq!(get.status, 206);
        }
        for shard in ["model-00001-of-00002", "model-00002-of-00002"] {
            let path = format!("/models/tiny/{shard}.safetensors");
            let first = gets(&log).into_iter().find(|l| l.path == path).unwrap();
            assert_eq!(first.range, Some((0, 7)), "{shard}: the length first");
        }
        let index = "/models/tiny/model.safetensors.index.json";
        assert!(log.iter().any(|l| l.path == index && l.method == "GET"));
    }
}

#[test]
fn one_object_and_an_index_url_load_too() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    let mut load = loader(options(), 2)
        .open(server.url("/m/model.safetensors.index.json"))
        .unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    let contents = write_file(&path, &[TensorSpec::bytes("w", 5000)], 1).unwrap();
    server.put("/single/x.safetensors", std::fs::read(&path).unwrap());
    let mut load = loader(options(), 1)
        .open(server.url("/single/x.safetensors"))
        .unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);
}

#[test]
fn the_host_path_assembles_remote_bytes_too() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    // A 1 MiB "device": the 2 and 3 MiB tensors cannot go there.
    let mut load = loader(options(), 2)
        .memory_cap(Some(MIB as u64))
        .open(server.url("/m"))
        .unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);
    let host: Vec<_> = loaded
        .iter()
        .filter(|(_, _, p)| *p == StagingPath::Host)
        .map(|(n, _, _)| n.as_str())
        .collect();
    assert!(
        host.contains(&"embed") && host.contains(&"layer.weight"),
        "{host:?}"
    );
}

#[test]
fn transient_failures_are_retried() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    for faults in [
        Faults {
            fail_first: true,
            ..Faults::default()
        },
        Faults {
            truncate_first: true,
            ..Faults::default()
        },
    ] {
        server.set_faults(faults.clone());
        server.clear_log();
        let mut load = loader(options(), 2).open(server.url("/m")).unwrap();
        let (loaded, error) = drain(&mut load);
        assert!(error.is_none(), "{faults:?}: {error:?}");
        assert_exact(&loaded, &contents);
        let log = server.log();
        if faults.fail_first {
            let failed = log.iter().filter(|l| l.status == 503).count();
            let ranges = gets(&log).iter().filter(|l| l.status == 206).count();
            assert!(
                failed > 0 && failed == ranges,
                "{failed} 503s for {ranges} ranges"
            );
        } else {
            // A body cut short is asked for again from where it stopped.
            let resumed = gets(&log).windows(2).any(|w| {
                w[0].path == w[1].path
                    && matches!((w[0].range, w[1].range), (Some((a, b)), Some((c, d))) if c > a && d == b)
            });
            assert!(resumed || gets(&log).len() > 2 * contents.len(), "{log:#?}");
        }
    }
}

#[test]
fn a_body_always_cut_short_fails_naming_url_tensor_and_offset() {
    let server = RangeServer::start().unwrap();
    let (_dir, _) = sharded(&server, "/m");
    let mut load = loader(options(), 1).open(server.url("/m")).unwrap();
    // Headers were read before the fault.
    server.set_faults(Faults {
        truncate_always: true,
        ..Faults::default()
    });
    let (loaded, error) = drain(&mut load);
    assert!(loaded.is_empty(), "nothing half-read is handed out");
    let message = error.unwrap().to_string();
    assert!(message.contains("embed"), "{message}");
    assert!(
        message.contains(&server.url("/m/model-00001-of-00002.safetensors")),
        "{message}"
    );
    assert!(message.contains("offset"), "{message}");
    assert!(load.next().is_none(), "nothing after the error");
    assert_eq!(load.held_memory().device_bytes(), 0);
}

#[test]
fn an_object_replaced_during_the_load_is_an_error_naming_it() {
    let server = RangeServer::start().unwrap();
    let (dir, contents) = sharded(&server, "/m");
    // One request at a time, one I/O thread: nothing is read ahead of the consumer.
    let mut serial = options();
    serial.concurrency = 1;
    let mut load = loader(serial, 1).open(server.url("/m")).unwrap();
    let first = load.next().unwrap().unwrap();
    assert_eq!(first.to_vec().unwrap(), contents[first.name()]);
    // Same bytes, new ETag: a new version is a new version.
    let shard = dir.path().join("model-00001-of-00002.safetensors");
    server.put(
        "/m/model-00001-of-00002.safetensors",
        std::fs::read(shard).unwrap(),
    );
    let (loaded, error) = drain(&mut load);
    let message = error.expect("the replaced object is noticed").to_string();
    assert!(message.contains("changed during the load"), "{message}");
    assert!(
        message.contains("/m/model-00001-of-00002.safetensors"),
        "{message}"
    );
    assert!(
        loaded.iter().all(|(name, _, _)| !name.starts_with("small")),
        "nothing from the replaced object after the change: {loaded:?}"
    );
    assert!(server.log().iter().any(|l| l.status == 412));
}

#[test]
fn without_etags_a_replaced_object_of_another_size_is_noticed() {
    let server = RangeServer::start().unwrap();
    server.set_faults(Faults {
        no_etag: true,
        ..Faults::default()
    });
    let (_dir, _) = sharded(&server, "/m");
    let mut load = loader(options(), 1).open(server.url("/m")).unwrap();
    server.put("/m/model-00001-of-00002.safetensors", vec![0u8; 1000]);
    let (loaded, error) = drain(&mut load);
    assert!(loaded.is_empty());
    let message = error.unwrap().to_string();
    assert!(message.contains("changed during the load"), "{message}");
}

/// A load of one request at a time on one I/O thread (nothing read ahead of the consumer) that
/// takes its first tensor, then has shard 1 replaced by bytes of the same size with one byte
/// flipped (a fine-tune re-uploaded with the same shapes), then drains the rest.
fn replace_same_size_mid_load(
    faults: Faults,
) -> (Contents, Loaded, Option<Error>, Load<'static>, RangeServer) {
    let server = RangeServer::start().unwrap();
    server.set_faults(faults);
    let (dir, contents) = sharded(&server, "/m");
    let mut serial = options();
    serial.concurrency = 1;
    let mut load = loader(serial, 1).open(server.url("/m")).unwrap();
    let first = load.next().unwrap().unwrap();
    assert_eq!(first.name(), "embed");
    assert_eq!(first.to_vec().unwrap(), contents["embed"]);
    let mut replaced = std::fs::read(dir.path().join("model-00001-of-00002.safetensors")).unwrap();
    let last = replaced.len() - 1;
    replaced[last] ^= 0xff;
    server.put("/m/model-00001-of-00002.safetensors", replaced);
    let (loaded, error) = drain(&mut load);
    (contents, loaded, error, load, server)
}

#[test]
fn with_last_modified_only_a_same_size_replacement_is_an_error_naming_it() {
    // The server honours If-Unmodified-Since (a 412), or ignores it (the response's
    // Last-Modified is compared).
    for ignore_conditions in [false, true] {
        let (_, loaded, error, load, server) = replace_same_size_mid_load(Faults {
            no_etag: true,
            ignore_conditions,
            ..Faults::default()
        });
        let message = error.expect("the replaced object is noticed").to_string();
        assert!(message.contains("changed during the load"), "{message}");
        assert!(message.contains("Last-Modified"), "{message}");
        assert!(
            message.contains(&server.url("/m/model-00001-of-00002.safetensors")),
            "{message}"
        );
        assert!(loaded.is_empty(), "nothing after the change: {loaded:?}");
        assert_eq!(load.report().unchanged_by, "last-modified");
        let log = server.log();
        let tensor_gets: Vec<_> = gets(&log)
            .into_iter()
            .filter(|l| l.range.is_some_and(|(a, _)| a > 7))
            .collect();
        assert!(
            tensor_gets
                .iter()
                .all(|l| l.if_unmodified_since.is_some() && l.if_match.is_none()),
            "every read is conditional on the date: {tensor_gets:#?}"
        );
        if !ignore_conditions {
            assert!(log.iter().any(|l| l.status == 412), "{log:#?}");
        }
    }
}

#[test]
fn with_etags_a_server_ignoring_if_match_is_caught_by_the_response_etag() {
    let (_, loaded, error, load, _server) = replace_same_size_mid_load(Faults {
        ignore_conditions: true,
        ..Faults::default()
    });
    let message = error.expect("the replaced object is noticed").to_string();
    assert!(message.contains("changed during the load"), "{message}");
    assert!(message.contains("ETag"), "{message}");
    assert!(loaded.is_empty(), "{loaded:?}");
    assert_eq!(load.report().unchanged_by, "etag");
}

#[test]
fn without_any_validator_only_the_size_is_checked_and_the_report_says_so() {
    // Documented: with neither ETag nor Last-Modified a replacement of the same size cannot be
    // seen. The load goes on, and `unchanged_by` tells the caller how little was checked.
    let (contents, loaded, error, load, server) = replace_same_size_mid_load(Faults {
        no_etag: true,
        no_last_modified: true,
        ..Faults::default()
    });
    assert!(error.is_none(), "{error:?}");
    assert_eq!(load.report().unchanged_by, "size");
    assert_eq!(loaded.len(), contents.len() - 1);
    let log = server.log();
    assert!(
        gets(&log)
            .iter()
            .all(|l| l.if_match.is_none() && l.if_unmodified_since.is_none()),
        "nothing to be conditional on"
    );
}

#[test]
fn without_an_etag_a_cut_body_is_asked_for_whole_again_never_resumed() {
    let server = RangeServer::start().unwrap();
    let (_dir, _) = sharded(&server, "/m");
    let mut load = loader(options(), 2).open(server.url("/m")).unwrap();
    server.set_faults(Faults {
        no_etag: true,
        truncate_first: true,
        ..Faults::default()
    });
    server.clear_log();
    let (loaded, error) = drain(&mut load);
    // (The headers were read with ETags; the version recorded then has one, so this load is
    // validated by ETag, which the server now leaves out: every response is refused.)
    let message = error
        .expect("a response without the ETag recorded is refused")
        .to_string();
    assert!(message.contains("no ETag"), "{message}");
    assert!(loaded.is_empty(), "{loaded:?}");

    // A server without ETags from the start: the cut range is asked for again whole, under
    // If-Unmodified-Since, and the load is byte-exact.
    let server = RangeServer::start().unwrap();
    server.set_faults(Faults {
        no_etag: true,
        truncate_first: true,
        ..Faults::default()
    });
    let (_dir, contents) = sharded(&server, "/m");
    let mut load = loader(options(), 2).open(server.url("/m")).unwrap();
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);
    assert_eq!(load.report().unchanged_by, "last-modified");
    let log = server.log();
    let tensor_gets: Vec<_> = gets(&log)
        .into_iter()
        .filter(|l| l.range.is_some_and(|(a, _)| a > 7))
        .collect();
    // Each range was cut once and asked for again, whole: the same range twice, no suffix.
    let mut ranges: Vec<_> = tensor_gets
        .iter()
        .map(|l| (l.path.clone(), l.range))
        .collect();
    let asked = ranges.len();
    ranges.sort();
    ranges.dedup();
    assert!(!ranges.is_empty());
    assert_eq!(asked, 2 * ranges.len(), "{tensor_gets:#?}");

    // Every body cut: an error after max_retries whole retries per range, naming the object.
    let mut load = loader(options(), 1).open(server.url("/m")).unwrap();
    server.set_faults(Faults {
        no_etag: true,
        truncate_always: true,
        ..Faults::default()
    });
    server.clear_log();
    let (loaded, error) = drain(&mut load);
    assert!(loaded.is_empty());
    let message = error.unwrap().to_string();
    assert!(
        message.contains("embed") && message.contains("offset"),
        "{message}"
    );
    assert!(
        message.contains(&server.url("/m/model-00001-of-00002.safetensors")),
        "{message}"
    );
    // Each range at most 1 + max_retries times, whole each time; the one that failed that often.
    let log = server.log();
    let mut tries = std::collections::HashMap::new();
    for get in gets(&log) {
        *tries.entry((get.path.clone(), get.range)).or_insert(0) += 1;
    }
    assert_eq!(
        tries.values().max(),
        Some(&(1 + options().max_retries)),
        "{tries:?}"
    );
}

/// A multi-thread tokio runtime of two workers, as an async caller's.
fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Opens and drains `url` on this thread; the bytes of every tensor, or the error.
fn load_all(url: &str) -> Result<Loaded, Error> {
    let mut load = loader(options(), 2).open(url)?;
    let (loaded, error) = drain(&mut load);
    error.map_or(Ok(loaded), Err)
}

#[test]
fn async_callers_load_from_spawn_blocking_and_get_an_error_on_a_worker() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    let url = server.url("/m");
    let multi = multi_thread_runtime();
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for runtime in [&multi, &current] {
        runtime.block_on(async {
            // From a blocking thread, as the error message recommends: it works.
            let u = url.clone();
            let loaded = tokio::task::spawn_blocking(move || load_all(&u))
                .await
                .unwrap()
                .unwrap();
            assert_exact(&loaded, &contents);
            // On a worker (an async task): a clear error, no panic.
            let u = url.clone();
            let error = tokio::spawn(async move { load_all(&u).map(|_| ()) })
                .await
                .expect("no panic")
                .unwrap_err()
                .to_string();
            assert!(error.contains("spawn_blocking"), "{error}");
            // In the runtime's own block_on as well.
            let error = load_all(&url).map(|_| ()).unwrap_err().to_string();
            assert!(error.contains("async task"), "{error}");
        });
    }
}

#[test]
fn a_remote_load_dropped_in_async_code_does_not_panic() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    let url = server.url("/m");
    let runtime = multi_thread_runtime();
    runtime.block_on(async {
        let mut load = tokio::task::spawn_blocking(move || loader(options(), 2).open(url))
            .await
            .unwrap()
            .unwrap();
        // Half-read: a tensor taken, the rest still held by the load (and its runtime).
        let (load, first) = tokio::task::spawn_blocking(move || {
            let first = load.next().unwrap().unwrap();
            (load, first)
        })
        .await
        .unwrap();
        assert_eq!(first.to_vec().unwrap(), contents[first.name()]);
        // Dropped in a worker task and in block_on's future: tokio would panic dropping a
        // runtime here; the remote's runtime shuts down in the background instead.
        tokio::spawn(async move { drop(load) })
            .await
            .expect("no panic");
        drop(first);
    });
    let load = loader(options(), 1).open(server.url("/m")).unwrap();
    runtime.block_on(async move { drop(load) });
}

#[test]
fn an_interrupt_ends_a_stalled_get_promptly() {
    let server = RangeServer::start().unwrap();
    let (_dir, _) = sharded(&server, "/m");
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut stalling = options();
    stalling.request_timeout = Duration::from_secs(120);
    stalling.interrupt = Some(safetensors_staging::remote::Interrupt::new({
        let fired = std::sync::Arc::clone(&fired);
        move || fired.load(std::sync::atomic::Ordering::Acquire)
    }));
    for threads in [1, 3] {
        fired.store(false, std::sync::atomic::Ordering::Release);
        server.set_faults(Faults::default());
        let mut load = loader(stalling.clone(), threads)
            .open(server.url("/m"))
            .unwrap();
        server.set_faults(Faults {
            stall: true,
            ..Faults::default()
        });
        let interrupter = {
            let fired = std::sync::Arc::clone(&fired);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                fired.store(true, std::sync::atomic::Ordering::Release);
                Instant::now()
            })
        };
        let (loaded, error) = drain(&mut load);
        let ended = Instant::now();
        let fired_at = interrupter.join().unwrap();
        assert!(loaded.is_empty());
        let message = error
            .expect("the stalled load ends with an error")
            .to_string();
        assert!(message.contains("interrupted"), "{message}");
        let after = ended.saturating_duration_since(fired_at);
        assert!(
            after < Duration::from_secs(5),
            "ended {after:?} after the interrupt (the request timeout is 120 s)"
        );
    }
}

#[test]
fn missing_and_denied_objects_are_one_clear_error() {
    let server = RangeServer::start().unwrap();
    let (_dir, _) = sharded(&server, "/m");
    // Nothing there at all.
    let e = loader(options(), 1)
        .open(server.url("/absent"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&server.url("/absent")), "{e}");
    // A shard the index names is missing.
    server.remove("/m/model-00002-of-00002.safetensors");
    let e = loader(options(), 1)
        .open(server.url("/m"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
    // A denied object: no retries (403 is not transient), the URL in the message.
    let (_dir2, _) = sharded(&server, "/d");
    server.set_faults(Faults {
        denied: ["/d/model-00001-of-00002.safetensors".to_owned()].into(),
        ..Faults::default()
    });
    server.clear_log();
    let e = loader(options(), 1)
        .open(server.url("/d"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/d/model-00001-of-00002.safetensors"), "{e}");
    let denied = server.log().iter().filter(|l| l.status == 403).count();
    assert_eq!(denied, 1, "a denied request is not retried");
    // A scheme nobody reads.
    let e = loader(options(), 1)
        .open("ftp://host/model")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unsupported scheme"), "{e}");
}

#[test]
fn malformed_checkpoints_served_over_http_are_refused_like_local_ones() {
    let server = RangeServer::start().unwrap();
    let host = || Loader::new().backend(Backend::Host(HostOptions::default()));
    let open = |loader: Loader<'static>, paths: &[String]| match paths {
        [one] => loader.open(one),
        many => loader.open_files(many),
    };
    for case in MALFORMED {
        let dir = tempfile::tempdir().unwrap();
        let paths = build(case, dir.path());
        let ckpt = dir.path().join("ckpt");
        // The regular files are uploaded; a fifo or a directory has no object.
        server.put_dir(&format!("/{case}"), &ckpt).unwrap();
        let urls: Vec<String> = paths
            .iter()
            .map(|p| {
                let rel = p.strip_prefix(&ckpt).unwrap_or(p.as_path());
                server.url(&format!("/{case}/{}", rel.display()))
            })
            .collect();
        let locals: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let failed = |result: safetensors_staging::Result<Load<'static>>| match result {
            Err(e) => Some(e.to_string()),
            Ok(mut load) => drain(&mut load).1.map(|e| e.to_string()),
        };
        let local = failed(open(host(), &locals));
        let remote = failed(open(loader(options(), 1), &urls));
        assert!(local.is_some(), "{case}: the local load failed");
        let remote = remote.unwrap_or_else(|| panic!("{case}: the remote load succeeded"));
        assert!(remote.contains(&server.url("/")), "{case}: {remote}");
    }
}

#[test]
fn the_bandwidth_cap_holds() {
    let server = RangeServer::start().unwrap();
    let (_dir, contents) = sharded(&server, "/m");
    let total: usize = contents.values().map(Vec::len).sum();
    let mut capped = options();
    capped.bandwidth = Some(20 * MIB as u64);
    let started = Instant::now();
    let mut load = loader(capped, 3).open(server.url("/m")).unwrap();
    let (loaded, error) = drain(&mut load);
    let elapsed = started.elapsed().as_secs_f64();
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);
    // A lower bound only (a cap cannot make a load faster): 5.2 MiB at 20 MiB/s.
    let floor = 0.9 * total as f64 / (20 * MIB) as f64;
    assert!(elapsed >= floor, "{elapsed:.3} s < {floor:.3} s");
}

#[test]
fn an_s3_prefix_without_an_index_lists_its_shards_in_natural_order() {
    // The range server answers S3's path-style ListObjectsV2 too: the S3 client's own listing,
    // HEAD and ranged GET, against a real socket (credentials are not checked here; moto's
    // server checks them in the Python suite).
    let server = RangeServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut contents = Contents::new();
    for (i, name) in [
        "shard-10.safetensors",
        "shard-2.safetensors",
        "shard-1.safetensors",
    ]
    .iter()
    .enumerate()
    {
        let path = dir.path().join(name);
        let tensor = format!("t{i}");
        contents
            .extend(write_file(&path, &[TensorSpec::bytes(&tensor, 1000 + i)], i as u64).unwrap());
        server.put(
            &format!("/bucket/ckpt/{name}"),
            std::fs::read(&path).unwrap(),
        );
    }
    server.put("/bucket/ckpt/README.md", b"not a shard".to_vec());
    server.put(
        "/bucket/ckpt/sub/other.safetensors",
        b"not listed: in a sub-prefix".to_vec(),
    );
    let mut options = options();
    options.config = vec![
        ("aws_endpoint".to_owned(), server.url("")),
        ("aws_access_key_id".to_owned(), "test".to_owned()),
        ("aws_secret_access_key".to_owned(), "test".to_owned()),
        ("aws_region".to_owned(), "us-east-1".to_owned()),
    ];
    let mut load = loader(options, 2).open("s3://bucket/ckpt").unwrap();
    let files: Vec<String> = load
        .checkpoint()
        .files()
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    assert_eq!(
        files,
        [
            "s3://bucket/ckpt/shard-1.safetensors",
            "s3://bucket/ckpt/shard-2.safetensors",
            "s3://bucket/ckpt/shard-10.safetensors"
        ]
    );
    let (loaded, error) = drain(&mut load);
    assert!(error.is_none(), "{error:?}");
    assert_exact(&loaded, &contents);
    assert!(
        server
            .log()
            .iter()
            .any(|l| l.method == "GET" && l.path == "/bucket" && l.status == 200)
    );
}

/// A caller's own object store (here object_store's in-memory one: no network, no credentials)
/// is read through instead of one the library builds; the URL names the keys. Headers and the
/// load go through it, and a loader without it would look for a real bucket.
#[test]
fn a_callers_own_object_store_is_read_through() {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let contents = write_file(
        &path,
        &[TensorSpec::bytes("a", 300_000), TensorSpec::bytes("b", 7)],
        3,
    )
    .unwrap();
    let store = Arc::new(InMemory::new());
    let bytes = std::fs::read(&path).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.put(
            &object_store::path::Path::from("prefix/model.safetensors"),
            PutPayload::from(bytes),
        ))
        .unwrap();
    let url = "s3://no-such-bucket-anywhere/prefix";
    let checkpoint = Loader::new()
        .object_store(store.clone())
        .read_headers(&[url])
        .unwrap();
    assert_eq!(checkpoint.tensors().len(), 2);
    let load = Loader::new()
        .backend(Backend::Host(Default::default()))
        .object_store(store)
        .open(url)
        .unwrap();
    let mut got = Contents::new();
    for tensor in load {
        let tensor = tensor.unwrap();
        got.insert(tensor.name().to_owned(), tensor.to_vec().unwrap());
    }
    assert_eq!(got, contents);
}
