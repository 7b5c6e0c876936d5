"""Many ranks on this machine: `torch.distributed` with gloo, 2 and 3 processes spawned by
`torch.multiprocessing`. Each rank reads about 1/n of the bytes and ends with every tensor
byte-exact; a fault on one rank raises on every rank, quickly; `select`/`rows` per rank keep
only what was asked for."""

from __future__ import annotations

import datetime
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import write_sharded

TIMEOUT = datetime.timedelta(seconds=60)


def _reference(path: str) -> Dict[str, torch.Tensor]:
    import safetensors.torch

    out: Dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(safetensors.torch.load_file(f))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bytes(a.reshape(-1).view(torch.uint8).numpy())
        == bytes(b.reshape(-1).view(torch.uint8).numpy())
    )


def _worker(rank: int, world: int, scenario: str, paths: List[str], out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world, timeout=TIMEOUT
    )
    import safetensors_staging as st

    result: Dict[str, Any] = {"rank": rank}
    path = paths[rank]
    start = time.perf_counter()
    try:
        if scenario == "full":
            with st.stage(
                path, process_group=dist.group.WORLD, relay_chunk=1 << 20, batch_bytes=4 << 20
            ) as it:
                got = dict(it)
                report = it.report()
            want = _reference(path)
            result["names"] = list(got)
            result["bad"] = [n for n in want if not _same(got[n], want[n])]
            result.update(
                {
                    k: report[k]
                    for k in ("bytes_read", "bytes_received", "pieces_owned", "plan_fingerprint")
                }
            )
        elif scenario == "select":
            want = _reference(path)
            names = sorted(want)
            if rank == 0:
                select, rows = (lambda n: n.startswith("encoder.layer.0.")), None
            else:
                select = ["embeddings.word_embeddings.weight", names[-1]]
                rows = {"embeddings.word_embeddings.weight": f"{rank}/{world}"}
            got = st.load_file(
                path, process_group=dist.group.WORLD, select=select, rows=rows, relay_chunk=1 << 20
            )
            result["names"] = sorted(got)
            bad = []
            for n, t in got.items():
                expected = want[n]
                if rows and n in rows:
                    dim0 = expected.shape[0]
                    a, b = st._native._resolve_rows(rows[n], dim0)
                    expected = expected[a:b]
                if not _same(t, expected):
                    bad.append(n)
            result["bad"] = bad
        elif scenario == "fault-hook":
            # A read error from a test hook on rank 1, at its third piece, mid-exchange.
            if rank == 1:
                original = st.Stage.__next__
                calls = {"n": 0}

                def failing(self):
                    calls["n"] += 1
                    if calls["n"] == 3:
                        raise st.ReadError("injected: tensor 'x': read failed at offset 4096")
                    return original(self)

                st.Stage.__next__ = failing
            got = st.load_file(path, process_group=dist.group.WORLD, batch_bytes=1 << 20)
            result["finished"] = len(got)
        elif scenario == "dtype":
            # Only rank 0 keeps the F6 tensor torch has no dtype for.
            select = None if rank == 0 else ["x"]
            got = st.load_file(path, process_group=dist.group.WORLD, select=select)
            result["finished"] = len(got)
        else:  # "fault": the checkpoint of this rank may be broken
            got = st.load_file(path, process_group=dist.group.WORLD)
            result["finished"] = len(got)
    except st.StagingError as e:
        result["error"] = type(e).__name__
        result["message"] = str(e)
    result["seconds"] = time.perf_counter() - start
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    # The group is torn down as a caller would, after a failed load too; an abort there fails
    # the spawn (see the teardown test below).
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(world: int, scenario: str, paths: List[str], tmp_path: Path) -> List[Dict[str, Any]]:
    out = tmp_path / f"ranks-{scenario}-{world}"
    out.mkdir()
    mp.spawn(_worker, args=(world, scenario, paths, str(out)), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def sharded_with_a_big_tensor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards, 9.5 MiB in all; "big" (6 MiB) is larger than total / n for n = 2, 3."""
    directory = tmp_path_factory.mktemp("sharded")
    shards = [
        [("norm", "F32", (256,)), ("big", "BF16", (3072, 1024)), ("b", "F16", (128,))],
        [("w1", "F32", (512, 1024)), ("w2", "I64", (64, 1024)), ("scalar", "F64", ())],
    ]
    write_sharded(directory, shards, seed=13)
    return directory


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("which", ["minilm", "sharded"])
def test_every_rank_gets_every_tensor_reading_its_share(
    world, which, minilm_dir, sharded_with_a_big_tensor, tmp_path
):
    path = minilm_dir if which == "minilm" else sharded_with_a_big_tensor
    results = run_ranks(world, "full", [str(path)] * world, tmp_path)
    want = _reference(str(path))
    total = sum(t.nbytes for t in want.values())
    largest = max(t.nbytes for t in want.values())
    for r in results:
        assert r["bad"] == [] and sorted(r["names"]) == sorted(want), r
        # About 1/n each: at most an equal share plus the largest tensor.
        assert r["bytes_read"] <= total / world + largest, r
        assert r["bytes_read"] + r["bytes_received"] == total, r
        assert r["pieces_owned"] > 0
    assert sum(r["bytes_read"] for r in results) == total  # every byte read once
    assert len({r["plan_fingerprint"] for r in results}) == 1
    if which == "sharded":
        # "big" is split between ranks: no rank reads more than its share plus a small tensor
        # and a row of "big".
        small = max(t.nbytes for n, t in want.items() if n != "big")
        for r in results:
            assert r["bytes_read"] <= total / world + small + 2048, r


def test_a_broken_shard_on_one_rank_raises_on_every_rank(sharded_with_a_big_tensor, tmp_path):
    """Rank 1 sees a truncated copy of one shard (the others the good one): every rank raises
    the same MalformedCheckpointError naming rank 1, within seconds, and nobody hangs."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in sharded_with_a_big_tensor.iterdir():
        shutil.copy(f, bad / f.name)
    victim = sorted(bad.glob("*.safetensors"))[1]
    os.truncate(victim, victim.stat().st_size - 1000)
    paths = [str(sharded_with_a_big_tensor), str(bad), str(sharded_with_a_big_tensor)]
    started = time.perf_counter()
    results = run_ranks(3, "fault", paths, tmp_path)
    assert time.perf_counter() - started < 60
    for r in results:
        assert r.get("error") == "MalformedCheckpointError", r
        assert r["message"].startswith("rank 1: ") and victim.name in r["message"], r
        assert r["seconds"] < 10, r


def test_a_read_error_mid_exchange_raises_on_every_rank(minilm_dir, tmp_path):
    results = run_ranks(2, "fault-hook", [str(minilm_dir)] * 2, tmp_path)
    for r in results:
        assert r.get("error") == "ReadError", r
        assert r["message"] == "rank 1: injected: tensor 'x': read failed at offset 4096", r
        assert r["seconds"] < 10, r
        assert "finished" not in r  # nobody went on with a partial model


def test_a_dtype_one_rank_cannot_hand_over_fails_every_rank_before_the_exchange(tmp_path):
    from conftest import write_safetensors

    directory = tmp_path / "ckpt"
    directory.mkdir()
    write_safetensors(
        directory / "model.safetensors", [("f6", "F6_E2M3", (4, 8)), ("x", "F32", (64,))]
    )
    results = run_ranks(2, "dtype", [str(directory)] * 2, tmp_path)
    for r in results:
        assert r.get("error") == "UnsupportedDtypeError", r
        assert r["message"].startswith("rank 0: tensor 'f6'"), r
        assert "finished" not in r


def test_each_rank_keeps_only_what_it_selects(minilm_dir, tmp_path):
    results = run_ranks(3, "select", [str(minilm_dir)] * 3, tmp_path)
    want = _reference(str(minilm_dir))
    assert results[0]["names"] == sorted(n for n in want if n.startswith("encoder.layer.0."))
    for r in results[1:]:
        assert r["names"] == sorted(["embeddings.word_embeddings.weight", sorted(want)[-1]])
    for r in results:
        assert r["bad"] == [], r


def test_small_pieces_of_one_owner_travel_together():
    from safetensors_staging._distributed import _units

    mib = 1 << 20
    batch = [
        ("a", 0, 100, 0, None),
        ("b", 0, 200, 0, None),
        ("c", 0, 300, 1, None),  # owner changes
        ("d", 0, 8 * mib, 1, None),  # large: alone
        ("e", 0, 100, 1, None),
        ("f", 0, 3 * mib, 1, None),
        ("h", 0, 0, 1, None),
    ]
    batch += [(f"s{i}", 0, 900 << 10, 1, None) for i in range(5)]  # 5 x 0.9 MiB: 4 fit in 4 MiB
    # relay_chunk 4 MiB: pieces under 1 MiB are packed, at most 4 MiB a run.
    assert _units(batch, 4 * mib) == [[0, 1], [2], [3], [4], [5], [6, 7, 8, 9, 10], [11]]
    assert _units(batch, 64 * mib) == [[0, 1], list(range(2, 12))]
    assert [i for unit in _units(batch, 1 << 10) for i in unit] == list(range(len(batch)))


def _teardown_worker(rank: int, world: int, path: str, out: str, rounds: int) -> None:
    """`rounds` times: a group made, a load that fails mid-exchange (a read error injected on
    the last rank), a second load on the same group that must work, then the group torn down
    by the caller, as a training script would. The process then exits normally: an abort in
    any teardown (gloo's "terminate called without an active exception") fails the spawn."""
    import safetensors_staging as st

    original = st.Stage.__next__
    want = _reference(path)
    outcomes = []
    for round_ in range(rounds):
        dist.init_process_group(
            "gloo",
            init_method=f"file://{out}/rendezvous-{round_}",
            rank=rank,
            world_size=world,
            timeout=TIMEOUT,
        )
        calls = {"n": 0}

        def failing(self):
            calls["n"] += 1
            if calls["n"] == 3 + round_ % 3:
                raise st.ReadError("injected: read failed")
            return original(self)

        if rank == world - 1:
            st.Stage.__next__ = failing
        # Nothing of the failed load may keep the group alive: with the garbage collector off,
        # the group's reference count is what it was (a reference cycle through the exception
        # kept it, and gloo's tensors, until interpreter exit, where the process aborted).
        gc.disable()
        group = dist.group.WORLD
        refs = sys.getrefcount(group)
        try:
            st.load_file(path, process_group=group, batch_bytes=1 << 20, relay_chunk=1 << 18)
            first = "finished"
        except st.StagingError as e:
            first = type(e).__name__
        leaked = sys.getrefcount(group) - refs
        del group
        gc.enable()
        st.Stage.__next__ = original
        got = st.load_file(
            path, process_group=dist.group.WORLD, batch_bytes=1 << 20, relay_chunk=1 << 18
        )
        bad = [n for n in want if not _same(got[n], want[n])]
        outcomes.append([first, len(got), bad, leaked])
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(outcomes))


@pytest.mark.parametrize("world", [2, 3])
def test_a_failed_load_leaves_the_group_usable_and_its_teardown_clean(
    world, sharded_with_a_big_tensor, tmp_path
):
    rounds = 20
    out = tmp_path / f"teardown-{world}"
    out.mkdir()
    # join=True raises if any rank exits non-zero or is killed (SIGABRT from a C++ terminate).
    mp.spawn(
        _teardown_worker,
        args=(world, str(sharded_with_a_big_tensor), str(out), rounds),
        nprocs=world,
        join=True,
    )
    want = _reference(str(sharded_with_a_big_tensor))
    for r in range(world):
        outcomes = json.loads((out / f"rank{r}.json").read_text())
        assert len(outcomes) == rounds
        for first, kept, bad, leaked in outcomes:
            assert first == "ReadError", outcomes
            assert kept == len(want) and bad == [], outcomes
            assert leaked == 0, f"the failed load left {leaked} references to the group: {outcomes}"
