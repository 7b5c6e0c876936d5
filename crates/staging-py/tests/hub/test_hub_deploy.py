"""Where deployments take the Hub, `huggingface_hub` and this library side by side on the same
stand-in (the Rust suite's fake Hub, `fakehub.py`): a mirror addressed with a path, an outage
or a rate limit with the model cached, a commit that leaves the weights alone, a renamed
repository, a complete read-only cache without `.locks/`, a tree listing in pages. Each case
asserts what `huggingface_hub` does there (so that the stand-in's behaviour is checked by the
client everyone uses) and that a load does the same: the same bytes, no more downloaded.

The Rust suite's `tests/it/hub_deploy.rs` covers the same cases in more detail (the report,
the cache's files, the redirect hosts)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest
import torch
from fakehub import FakeHub

import safetensors_staging as st
import safetensors_staging.torch as stt

from test_fakehub import files_of, run_hf
from test_hub import REPO, SHARDS, assert_equal, cdn_sent, hub, sharded_dir, source_tensors

__all__ = ["hub", "sharded_dir"]  # the fixtures, used by name


def hf_snapshot(hub: FakeHub, cache: Path, **kwargs: Any) -> Tuple[Dict[str, Any], int]:
    """`snapshot_download` of the repo by `huggingface_hub` in a child (its result) and the
    bytes the CDN sent it."""
    hub.clear_log()
    [result] = run_hf(hub, cache, [("snapshot_download", {"repo_id": REPO, **kwargs})])
    return result, sum(cdn_sent(hub).values())


def ours(hub: FakeHub, path: str = f"hf://{REPO}") -> Tuple[Dict[str, torch.Tensor], int]:
    """The tensors a load of `path` hands out, and the bytes the CDN sent it."""
    hub.clear_log()
    tensors = stt.load_file(path)
    return tensors, sum(cdn_sent(hub).values())


def weights_of(directory: Path) -> int:
    return sum((directory / s).stat().st_size for s in SHARDS)


def hf_cache(hub: FakeHub) -> Path:
    cache: Path = hub.cache.parent.parent / "theirs" / "hub"
    cache.parent.mkdir(exist_ok=True)
    return cache


def both_cached(hub: FakeHub) -> Path:
    """The repo downloaded by `huggingface_hub` (into the cache returned) and loaded by the
    library (into the test's own cache): where each case starts from a cached model."""
    cache = hf_cache(hub)
    hf_snapshot(hub, cache)
    ours(hub)
    return cache


def snapshot_files(result: Dict[str, Any]) -> Dict[str, bytes]:
    assert "ok" in result, result
    return files_of(Path(result["ok"]))


def test_a_mirror_addressed_with_a_path(hub: FakeHub, sharded_dir: Path, monkeypatch) -> None:
    hub.set_prefix("/api/huggingfaceml/hf")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    assert hub.endpoint.endswith("/api/huggingfaceml/hf")
    theirs, their_bytes = hf_snapshot(hub, hf_cache(hub))
    assert snapshot_files(theirs) == files_of(sharded_dir)
    tensors, our_bytes = ours(hub)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == weights_of(sharded_dir)
    # Every request went under the mirror's path.
    assert all(e.path.startswith("/api/huggingfaceml/hf/") for e in hub.log() if e.server == "hub")


@pytest.mark.parametrize("status", [500, 503, 504, 429])
def test_an_outage_or_a_rate_limit_serves_the_cache(
    hub: FakeHub, sharded_dir: Path, status: int
) -> None:
    theirs_cache = both_cached(hub)
    hub.set_faults(outage=status)
    theirs, their_bytes = hf_snapshot(hub, theirs_cache)
    assert snapshot_files(theirs) == files_of(sharded_dir), status
    tensors, our_bytes = ours(hub)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == 0
    assert {e.status for e in hub.log()} == {status}, "the Hub was asked, and refused"


def test_an_outage_without_the_model_cached_fails_both(hub: FakeHub) -> None:
    hub.set_faults(outage=503)
    theirs, _ = hf_snapshot(hub, hf_cache(hub))
    assert "error" in theirs, theirs
    with pytest.raises(st.StagingError, match="503") as error:
        ours(hub)
    assert REPO in str(error.value)


def test_a_commit_that_leaves_the_weights_alone_downloads_none(
    hub: FakeHub, sharded_dir: Path
) -> None:
    theirs_cache = both_cached(hub)
    files = files_of(sharded_dir)
    files["config.json"] = b'{"model_type": "bert", "edited": true}'
    commit = hub.add_commit(REPO, files)
    theirs, their_bytes = hf_snapshot(hub, theirs_cache)
    assert Path(theirs["ok"]).name == commit
    tensors, our_bytes = ours(hub)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == 0
    assert (
        hub.cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main"
    ).read_text() == commit


def test_one_changed_shard_of_a_new_commit_is_the_only_download(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    theirs_cache = both_cached(hub)
    files = files_of(sharded_dir)
    changed = bytearray(files[SHARDS[1]])
    changed[-1] ^= 0xFF  # the last byte of a tensor's data
    files[SHARDS[1]] = bytes(changed)
    hub.add_commit(REPO, files)
    _, their_bytes = hf_snapshot(hub, theirs_cache)
    _, our_bytes = ours(hub)
    assert our_bytes == their_bytes == len(changed)


def test_a_renamed_repository_is_followed(hub: FakeHub, sharded_dir: Path) -> None:
    hub.rename(REPO, "org/renamed")
    theirs, their_bytes = hf_snapshot(hub, hf_cache(hub))
    assert snapshot_files(theirs) == files_of(sharded_dir)
    tensors, our_bytes = ours(hub)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == weights_of(sharded_dir)
    assert any(e.status == 307 for e in hub.log())


def immutable(directory: Path, on: bool) -> bool:
    """`chattr +i` (binds root too) or `-i` on every file and folder under `directory`, the
    folder included; whether it could. Symbolic links are left out: chattr cannot flag one (it
    fails on them, having flagged the rest), and a link's target is flagged where it lies."""
    flag = "+i" if on else "-i"
    paths = [str(directory)]
    paths += [str(p) for p in directory.rglob("*") if not p.is_symlink()]
    done = subprocess.run(["chattr", flag, *paths], capture_output=True, check=False)
    return done.returncode == 0


def test_a_complete_read_only_cache_without_locks_loads_as_it_is(
    hub: FakeHub, sharded_dir: Path
) -> None:
    """A copied or mounted model volume: both clients read it and write nothing (where the file
    system cannot make root read-only, the test still sees nothing written)."""
    theirs_cache = both_cached(hub)
    caches = (theirs_cache, hub.cache)
    for cache in caches:
        subprocess.run(["rm", "-rf", str(cache / ".locks")], check=True)
    before = [sorted(p.relative_to(c).as_posix() for p in c.rglob("*")) for c in caches]
    try:
        for cache in caches:
            immutable(cache, True)
        theirs, their_bytes = hf_snapshot(hub, theirs_cache)
        tensors, our_bytes = ours(hub)
    finally:
        # Undone whatever +i said: a partial +i must not outlive the test (pytest could not
        # remove its temporary folders, 1.4 GB a run).
        for cache in caches:
            immutable(cache, False)
    assert snapshot_files(theirs) == files_of(sharded_dir)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == 0
    after = [sorted(p.relative_to(c).as_posix() for p in c.rglob("*")) for c in caches]
    assert after[1] == before[1], "we wrote nothing"


def test_a_tree_listing_in_pages(hub: FakeHub, sharded_dir: Path) -> None:
    hub.set_tree_page(1)
    theirs, their_bytes = hf_snapshot(hub, hf_cache(hub))
    assert snapshot_files(theirs) == files_of(sharded_dir)
    tensors, our_bytes = ours(hub)
    assert_equal(tensors, source_tensors(sharded_dir))
    assert our_bytes == their_bytes == weights_of(sharded_dir)


def test_a_tree_in_pages_is_all_of_what_the_library_lists(hub: FakeHub, sharded_dir: Path) -> None:
    """The library's own listing (what `since=` compares) reads every page."""
    from safetensors_staging import _native

    hub.set_tree_page(2)
    first: Optional[str] = hub.sharded
    files = files_of(sharded_dir)
    files["tokenizer.json"] = b"{}"
    hub.add_commit(REPO, files)
    changes = _native._hub_changes(f"hf://{REPO}", first)
    assert changes["changed"] == ["tokenizer.json"], changes
