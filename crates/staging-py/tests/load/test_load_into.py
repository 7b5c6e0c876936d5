"""`safetensors_staging.torch.load_into`: weights reloaded into the tensors that hold them.

A model trained one step, saved, and reloaded into the model it started from: every
parameter keeps its memory, and the outputs equal a fresh load of the new checkpoint's. A
checkpoint that does not fit changes nothing; a read that fails after writing began says which
tensors hold what; tied weights are written once; only= and rows= choose what is read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest
import safetensors.torch
import torch

import safetensors_staging as st
import safetensors_staging._load_into as load_into_module
from safetensors_staging.torch import load_into

from test_transformers import small_causal_lm

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def snapshot(model: Any) -> Dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def pointers(model: Any) -> Dict[str, int]:
    return {name: t.data_ptr() for name, t in model.state_dict().items()}


def trained_one_step(kind: str, tmp_path: Path) -> Any:
    """A small model saved as `tmp_path/kind`, then trained one step and saved again as
    `tmp_path/kind-step1`; returns the model as it was before the step, freshly loaded."""
    import transformers

    path = small_causal_lm(kind, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.tensor([[1, 17, 42, 99, 3, 250, 7, 8]])
    model(batch, labels=batch).loss.backward()
    optimizer.step()
    model.save_pretrained(tmp_path / f"{kind}-step1", max_shard_size="200KB")
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_a_trained_step_reloads_in_place_bit_equal_to_a_fresh_load(
    kind: str, tmp_path: Path
) -> None:
    import transformers

    model = trained_one_step(kind, tmp_path)
    before_ptrs, before = pointers(model), snapshot(model)
    result = load_into(model, tmp_path / f"{kind}-step1")
    assert result.missing_keys == [] and result.unexpected_keys == []
    # Every parameter kept its memory, and changed.
    assert pointers(model) == before_ptrs
    fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"{kind}-step1").eval()
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert any(not torch.equal(before[n], t) for n, t in model.state_dict().items())
    prompt = torch.tensor([[1, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        assert torch.equal(model(prompt).logits, fresh(prompt).logits)
    report = result.report
    # Every tensor went into the target's own memory: the destination path, read once.
    stored = safetensors_files_bytes(tmp_path / f"{kind}-step1")
    assert report["paths"]["destination"]["tensors"] == report["tensors"] > 0
    assert report["bytes_read"] == report["bytes"] == stored
    if kind == "llama":
        # Tied embeddings: the checkpoint has embed_tokens only; lm_head is the same memory.
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_minilm_trained_one_step_reloads_in_place(minilm_dir: Path, tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (a BERT encoder), trained one step and saved, reloaded into
    the model as it was: every parameter's memory kept, the embedding bit-equal to a fresh load
    of the new checkpoint."""
    import transformers

    model = transformers.AutoModel.from_pretrained(minilm_dir)
    model.train()
    tokens = torch.tensor([[101, 7592, 2088, 102]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(tokens).last_hidden_state.pow(2).mean().backward()
    optimizer.step()
    model.save_pretrained(tmp_path / "step1")
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    before_ptrs, before = pointers(model), snapshot(model)
    result = load_into(model, tmp_path / "step1")
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert pointers(model) == before_ptrs
    assert any(not torch.equal(before[n], t) for n, t in model.state_dict().items())
    fresh = transformers.AutoModel.from_pretrained(tmp_path / "step1").eval()
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    with torch.no_grad():
        assert torch.equal(model(tokens).last_hidden_state, fresh(tokens).last_hidden_state)
    assert result.report["paths"]["destination"]["tensors"] == result.report["tensors"] > 0


def safetensors_files_bytes(directory: Path) -> int:
    total = 0
    for path in directory.glob("*.safetensors"):
        with st.open(path) as checkpoint:
            total += checkpoint.total_bytes
    return total


def test_a_mismatch_changes_nothing_and_names_the_tensor(tmp_path: Path) -> None:
    target = {"a": torch.zeros(4, 8), "b": torch.zeros(3), "c": torch.zeros(2, dtype=torch.int64)}
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(
        {"a": torch.ones(4, 8), "b": torch.ones(5), "c": torch.ones(2, dtype=torch.int32)}, path
    )
    with pytest.raises(st.MismatchError) as caught:
        load_into(target, path)
    assert caught.value.problems == [
        "b: shape [5] in the checkpoint, [3] in the target",
        "c: dtype I32 in the checkpoint, torch.int64 in the target",
    ]
    assert "nothing was written" in str(caught.value)
    assert all(not t.any() for t in target.values()), "a mismatch writes nothing"
    # strict: a tensor missing from the checkpoint, or one the target lacks, is a mismatch too.
    safetensors.torch.save_file({"a": torch.ones(4, 8), "z": torch.ones(1)}, path)
    with pytest.raises(st.MismatchError) as caught:
        load_into({"a": target["a"], "b": target["b"]}, path)
    assert caught.value.problems == [
        "b: missing from the checkpoint",
        "z: in the checkpoint, not in the target",
    ]
    assert not target["a"].any()
    # Not strict: the ones both have are loaded, the rest returned.
    result = load_into({"a": target["a"], "b": target["b"]}, path, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (["b"], ["z"])
    assert torch.equal(target["a"], torch.ones(4, 8)) and not target["b"].any()
    # Memory that cannot be written in place is refused, before anything is written.
    safetensors.torch.save_file({"a": torch.full((4, 8), 2.0)}, path)
    transposed = torch.zeros(8, 4).t()
    with pytest.raises(st.MismatchError, match="a: not contiguous"):
        load_into({"a": transposed}, path)
    assert not transposed.any()


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
def test_a_read_that_fails_after_writing_began_says_what_each_tensor_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    names = [f"w{i}" for i in range(8)]
    new = {name: torch.full((256, 1024), float(i + 1)) for i, name in enumerate(names)}
    # Two shards of four tensors; the second loses its second half as its first tensor is
    # asked for (the load goes on, and fails reading it).
    shards = [
        tmp_path / "model-00001-of-00002.safetensors",
        tmp_path / "model-00002-of-00002.safetensors",
    ]
    safetensors.torch.save_file({n: new[n] for n in names[:4]}, shards[0])
    safetensors.torch.save_file({n: new[n] for n in names[4:]}, shards[1])
    index = {"metadata": {}, "weight_map": {n: shards[i // 4].name for i, n in enumerate(names)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    target = {name: torch.zeros(256, 1024) for name in names}
    asked = []

    def cut_short() -> bool:
        """Asked before each tensor is written."""
        asked.append(True)
        if len(asked) == 5:
            with open(shards[1], "r+b") as f:
                f.truncate(os.path.getsize(shards[1]) // 2)
        return False

    _between_tensors(monkeypatch, cut_short)
    with pytest.raises(st.PartialLoadError) as caught:
        load_into(target, tmp_path, threads=1, map=mapped)
    error = caught.value
    assert isinstance(error.__cause__, st.StagingError)
    assert str(shards[1]) in str(error.__cause__)  # the library's error names the file
    assert error.written == names[:4]
    assert "w7" in error.unchanged, "the second half of the file was never read"
    if mapped:
        # Copied out of the mapping, the second shard's tensors in one batch: the change is
        # found before a byte of it is copied, and each is said to be unchanged.
        assert (error.partly_written, error.unchanged) == ([], names[4:])
    # Exactly what it says: every tensor is new, old, or listed as maybe partly written.
    assert sorted(error.written + error.partly_written + error.unchanged) == sorted(names)
    for name in names:
        if name in error.written:
            assert torch.equal(target[name], new[name]), name
        elif name in error.unchanged:
            assert not target[name].any(), name


def test_only_and_rows_read_what_a_rank_holds(tmp_path: Path) -> None:
    full = {
        "layers.0.w": torch.arange(64.0).reshape(8, 8),
        "layers.1.w": torch.arange(64.0, 128.0).reshape(8, 8),
        "norm": torch.ones(8),
    }
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(full, path)
    rank = {"layers.0.w": torch.zeros(2, 8), "layers.1.w": torch.zeros(2, 8)}
    result = load_into(rank, path, only="layers.*", rows={"layers.*": "1/4"})
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert torch.equal(rank["layers.0.w"], full["layers.0.w"][2:4])
    assert torch.equal(rank["layers.1.w"], full["layers.1.w"][2:4])
    assert result.report["bytes_read"] == 2 * 2 * 8 * 4


def test_tied_weights_are_written_once(tmp_path: Path) -> None:
    shared = torch.zeros(16, 4)
    target = {"embed.weight": shared, "lm_head.weight": shared, "bias": torch.zeros(4)}
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"embed.weight": torch.ones(16, 4), "bias": torch.ones(4)}, path)
    result = load_into(target, path)
    assert result.missing_keys == []  # lm_head is embed, which the checkpoint has
    assert torch.equal(shared, torch.ones(16, 4)) and torch.equal(target["bias"], torch.ones(4))
    assert result.report["tensors"] == 2


def test_targets_sharing_part_of_their_memory_are_refused(tmp_path: Path) -> None:
    fused = torch.zeros(6, 4)  # q, k, v rows of one fused tensor
    target = {"qkv": fused, "q": fused[0:2]}
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"qkv": torch.ones(6, 4), "q": torch.full((2, 4), 2.0)}, path)
    with pytest.raises(st.MismatchError) as caught:
        load_into(target, path)
    assert caught.value.problems == [
        "q: its memory overlaps qkv's in the target (written in place, one would overwrite "
        "the other)"
    ]
    assert not fused.any(), "nothing written"


def test_the_target_decides_device_and_selection() -> None:
    with pytest.raises(TypeError, match="device"):
        load_into({}, "x.safetensors", device="cpu")
    with pytest.raises(TypeError, match="Module or a mapping"):
        load_into([torch.zeros(1)], "x.safetensors")


def _between_tensors(monkeypatch: pytest.MonkeyPatch, between: Any) -> None:
    """Makes the library's reload ask `between` before each tensor (True stops it there)."""
    real_native = load_into_module._native

    class Native:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_native, name)

        def _load_into(self, *args: Any, **kwargs: Any) -> Any:
            return real_native._load_into(*args, _between=between, **kwargs)

    monkeypatch.setattr(load_into_module, "_native", Native())


def _reload_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, between: Any
) -> tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], BaseException]:
    """A reload of 6 tensors whose library call asks `between` before each tensor."""
    names = [f"w{i}" for i in range(6)]
    new = {name: torch.full((64, 64), float(i + 1)) for i, name in enumerate(names)}
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(new, path)
    target = {name: torch.zeros(64, 64) for name in names}
    _between_tensors(monkeypatch, between)
    with pytest.raises(BaseException) as caught:
        load_into(target, path)
    return new, target, caught.value


def _stopping_at(n: int) -> Any:
    """A `between` that stops the reload before its `n`th tensor."""
    asked = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) == n

    return stop


def test_a_reload_stopped_between_two_tensors_says_which_hold_what(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, target, error = _reload_stopped(tmp_path, monkeypatch, _stopping_at(3))
    assert type(error) is st.PartialLoadError, repr(error)
    assert "stopped by the caller" in str(error.__cause__)
    assert (error.written, error.partly_written) == (["w0", "w1"], [])
    assert error.unchanged == ["w2", "w3", "w4", "w5"]
    for name in error.written:
        assert torch.equal(target[name], new[name]), name
    for name in error.unchanged:
        assert not target[name].any(), name


def test_ctrl_c_during_a_reload_is_a_keyboard_interrupt_that_says_which_hold_what(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    # A SIGINT during the reload, before the second tensor: Python's handler raises the
    # KeyboardInterrupt, which stops the reload there and is what the library raises.
    asked = []

    def send() -> bool:
        asked.append(True)
        if len(asked) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return False

    new, target, error = _reload_stopped(tmp_path, monkeypatch, send)
    assert isinstance(error, st.LoadIntoError), repr(error)
    assert isinstance(error, KeyboardInterrupt) and isinstance(error, st.PartialLoadError)
    assert isinstance(error.__cause__, KeyboardInterrupt)
    assert (error.written, error.partly_written) == (["w0"], [])
    assert error.unchanged == ["w1", "w2", "w3", "w4", "w5"]
    assert torch.equal(target["w0"], new["w0"]) and not target["w1"].any()


def _pending_backward() -> tuple[torch.nn.Module, torch.Tensor]:
    """A model and a loss whose backward saved the second layer's weight (to reach the first
    layer's gradient), so writing that weight before the backward must make it raise."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    loss = model(torch.randn(3, 4)).square().sum()
    return model, loss


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
def test_a_reload_bumps_every_version_as_load_state_dict_does(tmp_path: Path, mapped: bool) -> None:
    path = tmp_path / "model.safetensors"
    fresh, _ = _pending_backward()
    safetensors.torch.save_file({k: v + 1 for k, v in fresh.state_dict().items()}, path)
    # torch's own reload: the pending backward raises, naming the in-place change.
    theirs, loss = _pending_backward()
    theirs.load_state_dict(safetensors.torch.load_file(path))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    ours, loss = _pending_backward()
    versions = {name: t._version for name, t in ours.state_dict().items()}
    load_into(ours, path, map=mapped)
    for name, tensor in ours.state_dict().items():
        assert tensor._version > versions[name], name
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_failed_reload_bumps_the_versions_of_what_it_wrote_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, target, error = _reload_stopped(tmp_path, monkeypatch, _stopping_at(3))
    assert isinstance(error, st.PartialLoadError) and error.written == ["w0", "w1"]
    # Made fresh (version 0), only the two written were bumped.
    assert [name for name, t in target.items() if t._version > 0] == ["w0", "w1"]


def test_a_destination_tensor_has_its_version_bumped(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"w": torch.ones(8, 8)}, path)
    parameter = torch.nn.Parameter(torch.zeros(8, 8))
    loss = (parameter * parameter).sum()  # saves the parameter for its gradient
    into = parameter.detach()
    with st.stage(path, destination=lambda name, info: into) as tensors:
        ((name, tensor),) = list(tensors)
    assert tensor is into and torch.equal(parameter.detach(), torch.ones(8, 8))
    assert parameter._version == into._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


class _Tied(torch.nn.Module):
    """Two layers sharing one weight (`b.weight` is `a.weight`), as tied embeddings are."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = torch.nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight


@pytest.mark.parametrize("names", [("a.weight", "b.weight"), ("b.weight", "a.weight")])
def test_tied_weights_whose_copies_differ_keep_what_load_state_dict_keeps(
    tmp_path: Path, names: tuple[str, str]
) -> None:
    # The checkpoint's two copies differ, written in either order in the file.
    copies = {names[0]: torch.zeros(4, 4), names[1]: torch.ones(4, 4)}
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(copies, path)
    theirs = _Tied()
    theirs.load_state_dict(safetensors.torch.load_file(path))
    ours = _Tied()
    result = load_into(ours, path)
    # torch copies every name in the model's order: b.weight, the later, is what stays.
    assert torch.equal(theirs.a.weight, copies["b.weight"])
    assert torch.equal(ours.a.weight, theirs.a.weight)
    assert ours.a.weight is ours.b.weight
    assert result.report["tensors"] == 1
    # A mapping of names to tensors is taken in its own order, as a state dict is.
    shared = torch.full((4, 4), 7.0)
    load_into({"b.weight": shared, "a.weight": shared}, path)
    assert torch.equal(shared, copies["a.weight"])


def test_a_model_made_in_inference_mode_reloads_without_a_version_to_bump(tmp_path: Path) -> None:
    # Inference tensors have no version counter (torch before 2.5 raises when asked to bump
    # one): they are written and passed over.
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"weight": torch.ones(4, 4), "bias": torch.ones(4)}, path)
    with torch.inference_mode():
        model = torch.nn.Linear(4, 4)
    assert model.weight.is_inference()
    load_into(model, path)
    assert torch.equal(model.weight, torch.ones(4, 4)) and torch.equal(model.bias, torch.ones(4))


class _BufferOverParameter(torch.nn.Module):
    """A buffer registered as a parameter's `.data`: the same memory, its own autograd
    version counter."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))
        self.register_buffer("shadow", self.weight.data)


def test_every_tensor_over_the_memory_written_has_its_version_bumped(tmp_path: Path) -> None:
    """A `backward()` pending on the old bytes raises after the load, whichever name of the
    memory it saved, as it does after `load_state_dict` (issue 57.7: only one name per group
    was bumped, so a graph that saved the buffer silently used the new bytes)."""
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(
        {"weight": torch.full((8,), 2.0), "shadow": torch.full((8,), 2.0)}, path
    )
    for load in ("torch", "ours"):
        for saved in ("weight", "shadow"):
            model = _BufferOverParameter()
            x = torch.ones(8, requires_grad=True)
            # Saves one name's tensor (each has its own version counter).
            pending = (x * getattr(model, saved).detach()).sum()
            if load == "torch":
                model.load_state_dict(safetensors.torch.load_file(path))
            else:
                load_into(model, path)
            assert torch.equal(model.shadow, torch.full((8,), 2.0)), load
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                pending.backward()
