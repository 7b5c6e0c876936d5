"""`hf://org/name` through the Python door, against the fake Hub (`fakehub.py`) and against
`huggingface_hub` itself (run in a child Python with the same environment, since it reads its
settings at import): the tensors a load hands out, the Hugging Face cache it leaves (the tree
`snapshot_download` leaves, link for link and byte for byte, and one `huggingface_hub` then uses
offline), a cache `huggingface_hub` filled being a local load, and the Hub's errors as this
library's exceptions. The `transformers` helper and the engine plugins take a plain model id
and read it through `hf://` too.

What we do not write, and `huggingface_hub` 2.x does: `trees/<commit>.json` (its listing cache,
which it rebuilds when absent); the comparison of the two caches leaves `trees/` and `.locks/`
out.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple

import pytest
import safetensors.torch
import torch
from fakehub import FakeHub

import safetensors_staging as st
import safetensors_staging.torch as stt

from test_engines_sglang import DeviceConfig
from test_engines_sglang import ModelConfig as SglangModelConfig
from test_engines_vllm import Model, checkpoint, use_standin
from test_engines_vllm import ModelConfig as VllmModelConfig
from test_fakehub import files_of, run_hf

REPO = "org/sharded"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def save(directory: Path, name: str, tensors: Dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors, directory / name)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers-style repo: index, 2 shards, config, tokenizer, a file in a subfolder."""
    d = tmp_path_factory.mktemp("sharded")
    g = torch.Generator().manual_seed(11)
    save(d, SHARDS[0], {"a": torch.randn(256, 256, generator=g)})
    save(
        d,
        SHARDS[1],
        {
            "b": torch.randn(512, 256, generator=g).to(torch.float16),
            "c": torch.randint(-128, 127, (1000,), generator=g, dtype=torch.int8),
        },
    )
    weight_map = {"a": SHARDS[0], "b": SHARDS[1], "c": SHARDS[1]}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "config.json").write_text('{"model_type": "bert"}')
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"vocab": {"a": 0}}}')
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return d


def source_tensors(directory: Path) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for shard in SHARDS:
        out.update(safetensors.torch.load_file(directory / shard))
    return out


def version(n: int) -> Dict[str, bytes]:
    """A one-file model whose tensor holds `n` everywhere."""
    return {
        "config.json": json.dumps({"v": n}).encode(),
        "model.safetensors": safetensors.torch.save({"w": torch.full((64, 64), float(n))}),
    }


@pytest.fixture
def hub(sharded_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterable[FakeHub]:
    """A fresh fake Hub (faults off) and this process's environment pointed at it: its own
    cache (`hub.cache`), no token, online."""
    for name in list(os.environ):
        if name.startswith(("HF_", "HUGGINGFACE_")) or name == "TRANSFORMERS_OFFLINE":
            monkeypatch.delenv(name)
    with FakeHub() as h:
        h.sharded = h.add_repo(REPO, sharded_dir)
        h.v1 = h.add_repo("org/versions", version(1), revisions={"main": None, "v1": None})
        h.v2 = h.add_commit("org/versions", version(2))
        h.add_repo("org/gated", version(3), gated_tokens=["good"])
        h.cache = tmp_path / "ours" / "hub"
        h.cache.parent.mkdir()
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "ours" / "hf_home"))  # no token file
        monkeypatch.setenv("HF_HUB_CACHE", str(h.cache))
        yield h


def tree(root: Path, leave_out: Tuple[str, ...] = (".locks", "trees")) -> Dict[str, Any]:
    """Every entry under `root` but those under a directory named in `leave_out`: a link's
    target, a file's permissions and bytes, a directory as `"dir"`."""
    out: Dict[str, Any] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in leave_out]
        for name in dirs + files:
            path = Path(directory) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = (oct(path.stat().st_mode & 0o777), path.read_bytes())
    return out


def cdn(hub: FakeHub) -> List[str]:
    return [e.path for e in hub.log() if e.server == "cdn"]


def cdn_sent(hub: FakeHub) -> Dict[str, int]:
    """Body bytes the CDN sent, by file (its sha256)."""
    out: Dict[str, int] = {}
    for e in hub.log():
        if e.server == "cdn":
            out[e.path.rsplit("/", 1)[-1]] = out.get(e.path.rsplit("/", 1)[-1], 0) + e.sent
    return out


def shard_sizes(directory: Path) -> Dict[str, int]:
    """Each shard's size, by its sha256: what one read of each byte takes from the CDN."""
    return {
        hashlib.sha256((directory / s).read_bytes()).hexdigest(): (directory / s).stat().st_size
        for s in SHARDS
    }


def assert_equal(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


# -- the cache huggingface_hub leaves --


def test_a_cold_load_leaves_the_cache_snapshot_download_leaves(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    assert_equal(stt.load_file(f"hf://{REPO}"), source_tensors(sharded_dir))
    assert cdn_sent(hub) == shard_sizes(sharded_dir), "each byte of the shards, once, from the CDN"

    # huggingface_hub, offline, finds the snapshot we left, every file byte for byte.
    snapshot = hub.cache / "models--org--sharded" / "snapshots" / hub.sharded
    hub.clear_log()
    [found] = run_hf(
        hub, hub.cache, [("snapshot_download", {"repo_id": REPO, "local_files_only": True})]
    )
    assert found == {"ok": str(snapshot)}
    assert hub.log() == []
    assert files_of(snapshot) == files_of(sharded_dir)

    # A real snapshot_download into an empty cache leaves the same tree: names, link targets,
    # bytes (its trees/ listing cache and .locks/ aside).
    theirs = tmp_path / "theirs" / "hub"
    theirs.parent.mkdir()
    [done] = run_hf(hub, theirs, [("snapshot_download", {"repo_id": REPO})])
    assert done == {"ok": str(theirs / "models--org--sharded" / "snapshots" / hub.sharded)}
    assert tree(hub.cache) == tree(theirs)
    locks = ".locks/models--org--sharded"
    assert sorted(os.listdir(hub.cache / locks)) == sorted(os.listdir(theirs / locks))
    # What was left out: huggingface_hub 2.x writes its tree listing, we do not.
    assert sorted(p.name for p in (theirs / "models--org--sharded" / "trees").iterdir()) == [
        f"{hub.sharded}.json"
    ]
    assert not (hub.cache / "models--org--sharded" / "trees").exists()


def test_a_cache_huggingface_hub_filled_is_read_locally_and_offline_asks_nothing(
    hub: FakeHub, sharded_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_hf(hub, hub.cache, [("snapshot_download", {"repo_id": REPO})])
    before = tree(hub.cache, leave_out=())
    hub.clear_log()
    want = source_tensors(sharded_dir)
    assert_equal(stt.load_file(f"hf://{REPO}"), want)
    # The revision and the listing, and not one byte of a file.
    assert [(e.method, e.path) for e in hub.log()] == [
        ("GET", f"/api/models/{REPO}/revision/main"),
        ("GET", f"/api/models/{REPO}/tree/{hub.sharded}"),
    ]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.clear_log()
    assert_equal(stt.load_file(f"hf://{REPO}"), want)
    assert hub.log() == []
    assert tree(hub.cache, leave_out=()) == before, "a warm load changes nothing in the cache"


def test_offline_without_the_model_names_it(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(st.PathNotFoundError) as e:
        stt.load_file(f"hf://{REPO}")
    assert "HF_HUB_OFFLINE is set" in str(e.value) and REPO in str(e.value), str(e.value)
    assert hub.log() == []


def test_cache_off_writes_nothing(hub: FakeHub, sharded_dir: Path) -> None:
    assert_equal(stt.load_file(f"hf://{REPO}", cache=False), source_tensors(sharded_dir))
    assert cdn_sent(hub) == shard_sizes(sharded_dir)
    assert not hub.cache.exists()


def test_cache_dir_puts_the_cache_elsewhere(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    assert_equal(
        stt.load_file(f"hf://{REPO}", cache_dir=str(elsewhere)), source_tensors(sharded_dir)
    )
    assert not hub.cache.exists()
    assert (elsewhere / "models--org--sharded" / "refs" / "main").read_text() == hub.sharded


def test_safe_open_reads_keys_and_tensors(hub: FakeHub, sharded_dir: Path) -> None:
    want = source_tensors(sharded_dir)
    with st.safe_open(f"hf://{REPO}", framework="pt") as f:
        assert sorted(f.keys()) == sorted(want)
        assert torch.equal(f.get_tensor("b"), want["b"])
        assert torch.equal(f.get_slice("a")[3:5], want["a"][3:5])


def test_a_revision_by_tag_branch_and_commit(hub: FakeHub) -> None:
    assert hub.v1 != hub.v2
    for path, n in [
        ("hf://org/versions@v1", 1),
        ("hf://org/versions", 2),
        (f"hf://org/versions@{hub.v1}", 1),
        ("hf://org/versions@main", 2),
    ]:
        assert torch.equal(stt.load_file(path)["w"], torch.full((64, 64), float(n))), path
    refs = hub.cache / "models--org--versions" / "refs"
    assert (refs / "v1").read_text() == hub.v1 and (refs / "main").read_text() == hub.v2


def test_a_gated_model_without_a_token_says_one_is_needed(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(st.StagingError) as e:
        stt.load_file("hf://org/gated")
    message = str(e.value)
    assert "org/gated is a gated model: a token with access to it is needed" in message, message
    assert "set HF_TOKEN" in message, message
    # An I/O error of a path refused: the library's read error, and Python's PermissionError.
    assert type(e.value) is st.PathPermissionError
    assert isinstance(e.value, (st.ReadError, PermissionError))
    assert not (hub.cache / "models--org--gated" / "blobs").exists() or not any(
        (hub.cache / "models--org--gated" / "blobs").iterdir()
    )
    monkeypatch.setenv("HF_TOKEN", "wrong")
    with pytest.raises(st.PathPermissionError, match="has no access to it"):
        stt.load_file("hf://org/gated")
    monkeypatch.setenv("HF_TOKEN", "good")
    assert torch.equal(stt.load_file("hf://org/gated")["w"], torch.full((64, 64), 3.0))
    assert {e.authorization for e in hub.log() if e.server == "cdn"} == {None}


def test_unknown_model_revision_and_file(hub: FakeHub) -> None:
    for path, words in [
        ("hf://org/absent", "no model org/absent on the Hub"),
        ("hf://org/versions@nope", 'org/versions has no revision "nope"'),
        ("hf://org/versions/absent.safetensors", "absent.safetensors"),
    ]:
        with pytest.raises(st.PathNotFoundError) as e:
            stt.load_file(path)
        assert words in str(e.value), (path, str(e.value))


def test_a_corrupted_byte_fails_naming_the_file_and_leaves_no_blob(
    hub: FakeHub, sharded_dir: Path
) -> None:
    shard = SHARDS[1]
    data = (sharded_dir / shard).read_bytes()
    hub.set_faults(corrupt={shard: len(data) - 100})
    with pytest.raises(st.ReadError) as e:
        stt.load_file(f"hf://{REPO}")
    message = str(e.value)
    assert f"{shard}: the bytes received do not match the SHA-256 the Hub lists" in message, message
    assert "nothing of it was written to the cache" in message, message
    blobs = hub.cache / "models--org--sharded" / "blobs"
    left = sorted(p.name for p in blobs.iterdir())
    assert hashlib.sha256(data).hexdigest() not in left, left
    assert not [n for n in left if n.endswith(".incomplete")], left
    assert not (hub.cache / "models--org--sharded" / "snapshots" / hub.sharded / shard).exists()


# -- the engine plugins: a Hub model id streams through hf:// --


class Downloads:
    """Stands in for an engine's `download_weights_from_hf`: records each call, downloads
    nothing."""

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def __call__(self, model: str, *args: Any, **kwargs: Any) -> str:
        self.calls.append(model)
        raise AssertionError(f"the weights of {model} were downloaded first")


@pytest.fixture
def engine_repo(hub: FakeHub, tmp_path: Path) -> Dict[str, torch.Tensor]:
    """`org/tiny` on the fake Hub: at `v1`, the engine tests' checkpoint (index, 2 shards, a
    consolidated copy and `original/` beside them); on `main` a later commit without them."""
    tensors = checkpoint(tmp_path / "model")
    hub.tiny = hub.add_repo("org/tiny", tmp_path / "model", revisions={"main": None, "v1": None})
    hub.add_commit("org/tiny", {"config.json": b"{}"})
    return tensors


def assert_streamed(hub: FakeHub, model_dir: Path, downloads: Downloads) -> None:
    """The shards (and nothing else) came from the CDN, each byte once; nothing was downloaded
    first; the snapshot is in the cache."""
    want = {
        hashlib.sha256((model_dir / s).read_bytes()).hexdigest(): (model_dir / s).stat().st_size
        for s in SHARDS
    }
    assert cdn_sent(hub) == want
    assert downloads.calls == []
    snapshot = hub.cache / "models--org--tiny" / "snapshots" / hub.tiny
    for shard in SHARDS:
        assert (snapshot / shard).read_bytes() == (model_dir / shard).read_bytes()
    assert (hub.cache / "models--org--tiny" / "refs" / "v1").read_text() == hub.tiny


def test_vllm_loads_a_hub_model_through_hf(
    engine_repo: Dict[str, torch.Tensor],
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in use_standin(monkeypatch, "vllm"):
        from vllm.config.load import LoadConfig
        from vllm.model_executor.model_loader import weight_utils

        import safetensors_staging.vllm as plugin

        downloads = Downloads()
        monkeypatch.setattr(weight_utils, "download_weights_from_hf", downloads)
        loader = plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
        )
        config = VllmModelConfig("org/tiny")
        config.revision = "v1"
        loader.download_model(config)
        assert hub.log() == [], "download_model asked nothing of the Hub"
        model = Model()
        loader.load_weights(model, config)
        for name, tensor in engine_repo.items():
            assert torch.equal(dict(model.named_parameters())[name], tensor), name
        assert_streamed(hub, tmp_path / "model", downloads)
        assert loader.last_report["tensors"] == 3
        # A local directory of that name is read as a directory, not from the Hub.
        monkeypatch.chdir(tmp_path)
        (tmp_path / "org").mkdir()
        (tmp_path / "model").rename(tmp_path / "org" / "tiny")
        hub.clear_log()
        loader.load_weights(Model(), VllmModelConfig("org/tiny"))
        assert hub.log() == []


def test_vllm_weights_may_be_an_hf_path(
    engine_repo: Dict[str, torch.Tensor],
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in use_standin(monkeypatch, "vllm"):
        from vllm.config.load import LoadConfig

        import safetensors_staging.vllm as plugin

        (tmp_path / "config-only").mkdir()
        loader = plugin.StagingModelLoader(
            LoadConfig(
                load_format="staging", model_loader_extra_config={"weights": "hf://org/tiny@v1"}
            )
        )
        model = Model()
        loader.download_model(VllmModelConfig(str(tmp_path / "config-only")))
        loader.load_weights(model, VllmModelConfig(str(tmp_path / "config-only")))
        assert torch.equal(model.layer.weight, engine_repo["layer.weight"])
        assert_streamed(hub, tmp_path / "model", Downloads())


def test_vllm_download_dir_is_the_cache_and_cache_false_writes_none(
    engine_repo: Dict[str, torch.Tensor],
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in use_standin(monkeypatch, "vllm"):
        from vllm.config.load import LoadConfig

        import safetensors_staging.vllm as plugin

        config = VllmModelConfig("org/tiny")
        config.revision = "v1"
        elsewhere = tmp_path / "download-dir"
        loader = plugin.StagingModelLoader(
            LoadConfig(load_format="staging", download_dir=str(elsewhere))
        )
        loader.load_weights(Model(), config)
        refs = elsewhere / "models--org--tiny" / "refs" / "v1"
        assert refs.read_text() == hub.tiny and not hub.cache.exists()
        hub.clear_log()
        no_cache = plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"cache": False})
        )
        model = Model()
        no_cache.load_weights(model, config)
        assert torch.equal(model.embed.weight, engine_repo["embed.weight"])
        assert len(cdn_sent(hub)) == 2 and not hub.cache.exists()


def test_sglang_loads_a_hub_model_through_hf(
    engine_repo: Dict[str, torch.Tensor],
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in use_standin(monkeypatch, "sglang"):
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.model_loader import weight_utils
        from sglang.srt.model_loader.loader import get_model_loader

        import safetensors_staging.sglang as plugin

        downloads = Downloads()
        monkeypatch.setattr(weight_utils, "download_weights_from_hf", downloads)
        loader = get_model_loader(
            LoadConfig(
                load_format=plugin.StagingModelLoader,
                model_loader_extra_config={"backend": "host"},
            )
        )
        config = SglangModelConfig("org/tiny")
        config.revision = "v1"
        loader.download_model(config)
        assert hub.log() == [], "download_model asked nothing of the Hub"
        model = loader.load_model(model_config=config, device_config=DeviceConfig())
        for name, param in model.named_parameters():
            assert torch.equal(param, engine_repo[name]), name
        assert_streamed(hub, tmp_path / "model", downloads)


def test_a_model_id_is_told_from_a_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors_staging._engines import hub_path, is_repo_id

    for good in ["gpt2", "org/name", "Org-1/na_me.v2", "a/b", "x" * 96]:
        assert is_repo_id(good), good
    for bad in [
        "",
        "/abs/path",
        "./rel",
        "a/b/c",
        "-a",
        "a-",
        ".a",
        "a--b",
        "a..b",
        "a.git",
        "x" * 97,
        "a b",
        "é/x",
        "a/",
        "/a",
    ]:
        assert not is_repo_id(bad), bad
    monkeypatch.chdir(tmp_path)
    assert hub_path("org/name", None) == "hf://org/name@main"
    assert hub_path("gpt2", "refs/pr/1") == "hf://gpt2@refs%2Fpr%2F1"
    assert hub_path("hf://org/name@v1/sub", "ignored") == "hf://org/name@v1/sub"
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_path("org/name", None) is None, "an existing local path is local"
    assert hub_path(str(tmp_path / "elsewhere"), None) is None


# -- the transformers helper: a model id as transformers takes one --

CHILD_ENV_DROP = ("HF_", "HUGGINGFACE_")


def run_child(hub: FakeHub, cache: Path, code: str) -> str:
    """`code` in a child Python whose environment points `huggingface_hub` (which reads it at
    import) at the fake Hub and `cache`; its last line of output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CHILD_ENV_DROP)}
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(cache.parent / "hf_home"),
        HF_HUB_CACHE=str(cache),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def tiny_bert(directory: Path, seed: int) -> Path:
    """A small BERT of random weights, saved by `transformers` (one `model.safetensors`)."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def berts(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    """Two tiny BERTs: the first is `org/bert@v1`, the second its `main`."""
    root = tmp_path_factory.mktemp("berts")
    return tiny_bert(root / "v1", 3), tiny_bert(root / "main", 4)


def state_of(model: Any) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


@pytest.fixture
def bert_repo(hub: FakeHub, berts: Tuple[Path, Path]) -> FakeHub:
    hub.bert_v1 = hub.add_repo("org/bert", berts[0], revisions={"main": None, "v1": None})
    hub.bert_main = hub.add_commit("org/bert", files_of(berts[1]))
    return hub


def test_transformers_helper_takes_a_model_id(
    bert_repo: FakeHub, berts: Tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModel

    from safetensors_staging.transformers import from_pretrained

    hub = bert_repo
    # (path, keywords, the model there, its commit, whether its weights are already cached)
    for args, kwargs, source, commit, cached in [
        (("org/bert",), {"revision": "v1"}, berts[0], hub.bert_v1, False),
        (("org/bert",), {}, berts[1], hub.bert_main, False),
        (("hf://org/bert@v1",), {}, berts[0], hub.bert_v1, True),
    ]:
        hub.clear_log()
        got = from_pretrained(*args, **kwargs)
        assert type(got).__name__ == "BertModel"
        assert_same_state(state_of(got), state_of(AutoModel.from_pretrained(source)))
        weights = source / "model.safetensors"
        streamed = {hashlib.sha256(weights.read_bytes()).hexdigest(): weights.stat().st_size}
        assert cdn_sent(hub) == ({} if cached else streamed), (args, kwargs)
        snapshot = hub.cache / "models--org--bert" / "snapshots" / commit
        assert files_of(snapshot) == files_of(source)
    with pytest.raises(ValueError, match="revision='v1' given beside 'hf://org/bert'"):
        from_pretrained("hf://org/bert", revision="v1")
    # Offline, from the cache: no request at all.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.clear_log()
    offline = from_pretrained("org/bert", revision="v1")
    assert_same_state(state_of(offline), state_of(AutoModel.from_pretrained(berts[0])))
    assert hub.log() == []
    monkeypatch.delenv("HF_HUB_OFFLINE")

    # transformers itself, offline, finds the model in the cache we left.
    hub.clear_log()
    saved = tmp_path / "theirs.safetensors"
    code = (
        "import safetensors.torch\n"
        "from transformers import AutoModel\n"
        "m = AutoModel.from_pretrained('org/bert', revision='v1', local_files_only=True)\n"
        f"safetensors.torch.save_file(m.state_dict(), {str(saved)!r})\n"
        "print(type(m).__name__)"
    )
    assert run_child(hub, hub.cache, code) == "BertModel"
    assert hub.log() == []
    ours = state_of(AutoModel.from_pretrained(berts[0]))
    assert_same_state(safetensors.torch.load_file(saved), ours)


def test_transformers_helper_streaming_a_corrupted_byte_fails_naming_the_file(
    bert_repo: FakeHub, berts: Tuple[Path, Path]
) -> None:
    """The weights are read ahead while the model is built: a wrong byte in them still fails
    the load naming the file (none of it cached), and the thread reading ahead is gone."""
    import gc
    import threading

    import safetensors_staging.transformers as helper
    from safetensors_staging.transformers import from_pretrained

    started: list = []
    start = helper._ReadAhead.start

    def recording(self: Any) -> bool:
        started.append(start(self))
        return started[-1]

    data = (berts[1] / "model.safetensors").read_bytes()
    bert_repo.set_faults(corrupt={"model.safetensors": len(data) - 10})
    helper._ReadAhead.start = recording  # type: ignore[method-assign]
    try:
        with pytest.raises(st.ReadError) as e:
            from_pretrained("org/bert")
    finally:
        helper._ReadAhead.start = start  # type: ignore[method-assign]
    assert started == [True], "the weights were read ahead"
    assert gc.isenabled()
    message = str(e.value)
    assert (
        "model.safetensors: the bytes received do not match the SHA-256 the Hub lists" in message
    ), message
    assert not [t for t in threading.enumerate() if t.name == "from_pretrained-read-ahead"]
    blobs = bert_repo.cache / "models--org--bert" / "blobs"
    assert hashlib.sha256(data).hexdigest() not in {p.name for p in blobs.iterdir()}
    # Whole again: the same call loads the model.
    bert_repo.set_faults(corrupt={})
    from transformers import AutoModel

    assert_same_state(
        state_of(from_pretrained("org/bert")), state_of(AutoModel.from_pretrained(berts[1]))
    )


def test_transformers_helper_without_the_cache_gets_the_config_from_transformers(
    bert_repo: FakeHub, berts: Tuple[Path, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "child" / "hub"
    cache.parent.mkdir()
    saved = tmp_path / "ours.safetensors"
    code = (
        "import safetensors.torch\n"
        "from safetensors_staging.transformers import from_pretrained\n"
        "m = from_pretrained('org/bert', revision='v1', cache=False)\n"
        f"safetensors.torch.save_file(m.state_dict(), {str(saved)!r})\n"
        "print(type(m).__name__)"
    )
    assert run_child(bert_repo, cache, code) == "BertModel"
    from transformers import AutoModel

    assert_same_state(
        safetensors.torch.load_file(saved), state_of(AutoModel.from_pretrained(berts[0]))
    )
    # Only the config, which transformers fetched and cached itself; no weight.
    snapshot = cache / "models--org--bert" / "snapshots" / bert_repo.bert_v1
    assert sorted(files_of(snapshot)) == ["config.json"]
    weights = hashlib.sha256((berts[0] / "model.safetensors").read_bytes()).hexdigest()
    assert cdn_sent(bert_repo) == {weights: (berts[0] / "model.safetensors").stat().st_size}


# -- more of the cache huggingface_hub shares with us --


def test_a_cache_huggingface_hub_filled_in_part_is_completed_as_it_would_be(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    calls = [
        ("hf_hub_download", {"repo_id": REPO, "filename": name})
        for name in ("config.json", SHARDS[0])
    ]
    run_hf(hub, hub.cache, calls)
    first = hashlib.sha256((sharded_dir / SHARDS[0]).read_bytes()).hexdigest()
    blob = hub.cache / "models--org--sharded" / "blobs" / first
    kept = (blob.stat().st_ino, blob.stat().st_mtime_ns)
    hub.clear_log()
    assert_equal(stt.load_file(f"hf://{REPO}"), source_tensors(sharded_dir))
    assert (blob.stat().st_ino, blob.stat().st_mtime_ns) == kept, "its blob was left alone"
    # Only what the cache lacks comes over the network (each byte once): the shard
    # huggingface_hub had already fetched is read from its blob, and linked, not written again.
    missing = shard_sizes(sharded_dir)
    del missing[first]
    assert cdn_sent(hub) == missing
    theirs = tmp_path / "theirs" / "hub"
    theirs.parent.mkdir()
    run_hf(hub, theirs, [("snapshot_download", {"repo_id": REPO})])
    assert tree(hub.cache) == tree(theirs)


def test_a_branch_that_moved_is_followed(hub: FakeHub) -> None:
    assert torch.equal(stt.load_file("hf://org/versions")["w"], torch.full((64, 64), 2.0))
    v3 = hub.add_commit("org/versions", version(3))
    assert torch.equal(stt.load_file("hf://org/versions")["w"], torch.full((64, 64), 3.0))
    refs = hub.cache / "models--org--versions" / "refs"
    assert (refs / "main").read_text() == v3


def test_the_token_file_and_a_private_model(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("org/private", version(4), private_tokens=["secret"])
    with pytest.raises(st.PathNotFoundError) as e:
        stt.load_file("hf://org/private")
    assert "no model org/private on the Hub, or it is private" in str(e.value), str(e.value)
    token_file = tmp_path / "ours" / "hf_home" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text("secret\n")
    assert torch.equal(stt.load_file("hf://org/private")["w"], torch.full((64, 64), 4.0))
    assert {e.authorization for e in hub.log() if e.server == "hub"} == {None, "Bearer secret"}
    assert {e.auth for e in hub.log() if e.server == "cdn"} == {False}


def test_a_blob_another_process_is_writing_is_left_to_it(hub: FakeHub, sharded_dir: Path) -> None:
    import fcntl

    second = hashlib.sha256((sharded_dir / SHARDS[1]).read_bytes()).hexdigest()
    locks = hub.cache / ".locks" / "models--org--sharded"
    locks.mkdir(parents=True)
    # huggingface_hub's filelock: flock(2) on .locks/<repo>/<blob>.lock while it writes.
    with open(locks / f"{second}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert_equal(stt.load_file(f"hf://{REPO}"), source_tensors(sharded_dir))
        blobs = sorted(os.listdir(hub.cache / "models--org--sharded" / "blobs"))
        assert second not in blobs and not [b for b in blobs if "incomplete" in b], blobs
        snapshot = hub.cache / "models--org--sharded" / "snapshots" / hub.sharded
        assert (snapshot / SHARDS[0]).is_file() and not os.path.lexists(snapshot / SHARDS[1])
    # Once the lock is free, a load writes it.
    assert_equal(stt.load_file(f"hf://{REPO}"), source_tensors(sharded_dir))
    assert (snapshot / SHARDS[1]).read_bytes() == (sharded_dir / SHARDS[1]).read_bytes()


def test_a_load_beside_a_snapshot_download_in_the_same_cache(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    import threading
    import time

    hub.set_rate(400_000)  # a shard in about 0.65 s
    done: List[Any] = []
    child = threading.Thread(
        target=lambda: done.extend(
            run_hf(hub, hub.cache, [("snapshot_download", {"repo_id": REPO})])
        )
    )
    child.start()
    # Once huggingface_hub is writing a shard (a whole-file GET), this process loads too.
    deadline = time.monotonic() + 30
    while not [e for e in hub.log() if e.server == "cdn"] and time.monotonic() < deadline:
        time.sleep(0.005)
    got = stt.load_file(f"hf://{REPO}")
    child.join()
    hub.set_rate(None)
    assert_equal(got, source_tensors(sharded_dir))
    assert done == [{"ok": str(hub.cache / "models--org--sharded" / "snapshots" / hub.sharded)}]
    cdn_log = [(e.range is None, e.path, e.sent) for e in hub.log() if e.server == "cdn"]
    assert cdn_log[0][0] and any(not whole for whole, _, _ in cdn_log), cdn_log
    theirs = tmp_path / "theirs" / "hub"
    theirs.parent.mkdir()
    run_hf(hub, theirs, [("snapshot_download", {"repo_id": REPO})])
    assert tree(hub.cache) == tree(theirs)


def test_a_load_that_failed_before_any_file_leaves_no_snapshot(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gated model without a token fails before any file arrives. huggingface_hub's own
    failed `snapshot_download` leaves `refs/main` (and its trees/ listing) but no snapshot
    folder, so that `local_files_only=True` says the model is not in the cache; an empty
    `snapshots/<commit>/` would be taken for a downloaded model, by it and by an offline load.

    FAILS at the time of writing: the library creates `snapshots/<commit>/` before fetching
    the first small file (`hub::open`: `dirs.prepare(&commit)`), and leaves it empty."""
    with pytest.raises(st.PathPermissionError):
        stt.load_file("hf://org/gated")
    theirs = tmp_path / "theirs" / "hub"
    theirs.parent.mkdir()
    [failed] = run_hf(hub, theirs, [("snapshot_download", {"repo_id": "org/gated"})])
    assert failed["error"] == "GatedRepoError"
    local = ("snapshot_download", {"repo_id": "org/gated", "local_files_only": True})
    [after_theirs] = run_hf(hub, theirs, [local])
    assert after_theirs["error"] == "LocalEntryNotFoundError", after_theirs
    assert not (theirs / "models--org--gated" / "snapshots").exists()
    [after_ours] = run_hf(hub, hub.cache, [local])
    assert after_ours.get("error") == "LocalEntryNotFoundError", after_ours
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(st.PathNotFoundError, match="HF_HUB_OFFLINE is set"):
        stt.load_file("hf://org/gated")


# -- one source for each Hub fact: the library's --


def noted_bert(hub: FakeHub, berts: Tuple[Path, Path], repo: str) -> Tuple[str, str]:
    """`repo` with two commits of the two BERTs, each config noting which (`"note"`, a key
    `transformers` keeps as it is): the first tagged `v1`, the second `main`."""
    commits = []
    for source, note in zip(berts, ("v1", "main")):
        files = files_of(source)
        config = json.loads(files["config.json"])
        config["note"] = note
        files["config.json"] = json.dumps(config).encode()
        if not commits:
            commits.append(hub.add_repo(repo, files, revisions={"main": None, "v1": None}))
        else:
            commits.append(hub.add_commit(repo, files))
    return commits[0], commits[1]


def test_the_config_comes_from_the_commit_the_weights_are_read_at(
    hub: FakeHub, berts: Tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`refs/main` moving between the load's open and the config's read (another process
    fetching the next commit) gives the config of the commit the weights are read at: the
    load report's, not what the ref names a moment later."""
    from transformers import AutoModel

    import safetensors_staging.transformers as helper

    v1, main = noted_bert(hub, berts, "org/noted")
    # The cache holds both snapshots; the load resolves `main`.
    assert helper.from_pretrained("org/noted", revision="v1").config.note == "v1"
    assert helper.from_pretrained("org/noted").config.note == "main"
    refs = hub.cache / "models--org--noted" / "refs" / "main"
    real = helper.safe_open

    class MovesTheRef(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            refs.write_text(v1)  # another process moved `main` meanwhile

    monkeypatch.setattr(helper, "safe_open", MovesTheRef)
    got = helper.from_pretrained("org/noted")
    assert got.config.note == "main"
    assert_same_state(state_of(got), state_of(AutoModel.from_pretrained(berts[1])))


def test_cache_zero_means_what_the_library_says_it_means(
    hub: FakeHub, berts: Tuple[Path, Path], tmp_path: Path
) -> None:
    # `cache=0` is false to the library (nothing written): the helper takes the config from
    # transformers at the commit the weights were read at, not from a snapshot it assumed.
    v1, _ = noted_bert(hub, berts, "org/noted0")
    cache = tmp_path / "child" / "hub"
    cache.parent.mkdir()
    code = (
        "from safetensors_staging.transformers import from_pretrained\n"
        "m = from_pretrained('org/noted0', revision='v1', cache=0)\n"
        "print(m.config.note)"
    )
    assert run_child(hub, cache, code) == "v1"
    snapshot = cache / "models--org--noted0" / "snapshots" / v1
    assert sorted(files_of(snapshot)) == ["config.json"], "no weight written"


def test_a_repository_id_is_what_the_library_says_it_is() -> None:
    import safetensors_staging._engines as engines
    from safetensors_staging import _native

    names = ["org/name", "name", "org/name.git", "org/na--me", "-org/name", "a" * 97, "o/n/x"]
    assert [engines.is_repo_id(n) for n in names] == [_native._is_repo_id(n) for n in names]
    assert [_native._is_repo_id(n) for n in names] == [True, True] + [False] * 5
    with pytest.raises(st.StagingError, match="org/name.git"):
        stt.load_file("hf://org/name.git")


def test_a_reload_since_the_revision_held_reads_and_writes_the_changed_files_alone(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    """A model that holds v1 moved to the next commit, which rewrote the second shard: that
    shard alone is downloaded and its tensors alone written; the first shard's tensors keep
    their memory, bytes and autograd version."""
    from safetensors_staging.torch import load_into

    v1 = hub.sharded
    target = {name: t.clone() for name, t in stt.load_file(f"hf://{REPO}").items()}
    versions = {name: t._version for name, t in target.items()}
    next_dir = tmp_path / "next"
    shutil.copytree(sharded_dir, next_dir)
    new_b = torch.full((512, 256), 3.0, dtype=torch.float16)
    new_c = torch.arange(1000, dtype=torch.int8)
    save(next_dir, SHARDS[1], {"b": new_b, "c": new_c})
    v2 = hub.add_commit(REPO, files_of(next_dir))
    hub.clear_log()
    result = load_into(target, f"hf://{REPO}", since=v1)
    assert torch.equal(target["b"], new_b) and torch.equal(target["c"], new_c)
    assert torch.equal(target["a"], source_tensors(sharded_dir)["a"])
    assert target["a"]._version == versions["a"], "the unchanged tensor was not written"
    since = result.report["since"]
    assert (since["commit"], since["since"]) == (v2, v1)
    assert since["changed"] == [SHARDS[1]] and since["unchanged"] == ["a"]
    # That shard's bytes alone (its header is read twice: once to check every tensor fits the
    # target before a byte is written, once by the load).
    shard = (next_dir / SHARDS[1]).read_bytes()
    sent = cdn_sent(hub)
    assert list(sent) == [hashlib.sha256(shard).hexdigest()]
    assert len(shard) <= sent[hashlib.sha256(shard).hexdigest()] <= len(shard) * 1.01
    assert len(shard) <= result.report["hub"]["bytes_downloaded"] <= len(shard) * 1.01
    # Only an hf:// source has revisions.
    with pytest.raises(TypeError, match="since='main' names a revision"):
        load_into(target, next_dir, since="main")
