"""`safetensors_staging.transformers.from_pretrained` against `transformers`' own
`from_pretrained` on the same checkpoints: all-MiniLM-L6-v2, and small Qwen2- and
Llama-architecture models made here by `transformers` itself (random weights, saved sharded):
bit-equal embeddings, logits and a greedy `generate` of 20 tokens; and each weight read once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import safetensors_staging as st
from safetensors_staging.transformers import from_pretrained

from test_model import embed

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def small_causal_lm(kind: str, directory: Path) -> Path:
    """A small model of architecture `kind`, random weights, saved in shards of about 200 kB."""
    import transformers

    common = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if kind == "qwen2":
        config = transformers.Qwen2Config(**common, tie_word_embeddings=False)
        model_class = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**common, tie_word_embeddings=True)
        model_class = transformers.LlamaForCausalLM
    torch.manual_seed(7)
    model = model_class(config).eval()
    model.generation_config.pad_token_id = 0
    path = directory / kind
    model.save_pretrained(path, max_shard_size="200KB")
    return path


def same_state(a: Any, b: Any) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


def test_minilm_from_pretrained_is_bit_equal(minilm_dir: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    reference = AutoModel.from_pretrained(minilm_dir).eval()
    ours = from_pretrained(minilm_dir).eval()
    assert type(ours) is type(reference)
    same_state(ours, reference)
    assert torch.equal(embed(ours, tokenizer), embed(reference, tokenizer))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_causal_lm_logits_and_generation_are_bit_equal(kind: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = small_causal_lm(kind, tmp_path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "saved in shards"
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    ours = from_pretrained(path, AutoModelForCausalLM).eval()
    assert type(ours) is type(reference)
    same_state(ours, reference)
    if kind == "llama":
        assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr(), (
            "still tied"
        )
    prompt = torch.tensor([[1, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        assert torch.equal(ours(prompt).logits, reference(prompt).logits)
        want = reference.generate(prompt, max_new_tokens=20, do_sample=False)
        got = ours.generate(prompt, max_new_tokens=20, do_sample=False)
    assert want.shape == (1, 26) and torch.equal(got, want)


def test_each_weight_is_read_once_and_options_reach_the_loader(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = small_causal_lm("qwen2", tmp_path)
    total = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    seen: list = []
    original = st.safe_open

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.append((self, kwargs))

        def close(self) -> None:
            self.final = self.report()
            super().close()

    import safetensors_staging.transformers as helper

    helper.safe_open = Recording
    try:
        model = from_pretrained(
            path, AutoModelForCausalLM, chunk_size="64KiB", model_kwargs={"dtype": torch.float32}
        )
    finally:
        helper.safe_open = original
    ((handle, kwargs),) = seen
    assert (
        kwargs == {"framework": "pt", "device": "cpu", "chunk_size": "64KiB"}
        and handle.backend == "host"
    )
    report = handle.final
    headers = total - report["bytes_read"]
    assert report["tensors"] == len(model.state_dict()), "each weight read once"
    assert 0 < headers < 64 * 1024, "everything but the headers read, once"


@pytest.mark.parametrize("ahead_bytes", [None, 1])
def test_weights_read_ahead_are_the_ones_handed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead_bytes: Any
) -> None:
    """A handle that reads (here `map=False`; a Hub stream, a GPU) reads every weight ahead, in
    file order, while the model is built: each is read once, handed out to the weight it is
    (bit-equal to `transformers`'), and nothing is left held. With room for one tensor ahead
    (`ahead_bytes=1`), the weights asked for out of turn are read by the caller instead."""
    from transformers import AutoModelForCausalLM

    import safetensors_staging.transformers as helper

    if ahead_bytes is not None:
        monkeypatch.setattr(helper, "_AHEAD_BYTES", ahead_bytes)
    path = small_causal_lm("qwen2", tmp_path)
    handed: dict = {"ahead": 0, "own": 0}
    aheads: list = []
    take = helper._ReadAhead.take

    def counting(self: Any, name: str) -> Any:
        tensor = take(self, name)
        handed["ahead" if tensor is not None else "own"] += 1
        if self not in aheads:
            aheads.append(self)
        return tensor

    monkeypatch.setattr(helper._ReadAhead, "take", counting)
    handles: list = []
    original = st.safe_open

    class Recording(original):  # type: ignore[misc, valid-type]
        def close(self) -> None:
            if not handles:
                handles.append(self.report())
            super().close()

    monkeypatch.setattr(helper, "safe_open", Recording)
    model = from_pretrained(path, AutoModelForCausalLM, map=False).eval()
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    same_state(model, reference)
    tensors = len(model.state_dict())
    assert handed["ahead"] + handed["own"] == tensors
    if ahead_bytes is None:
        assert handed == {"ahead": tensors, "own": 0}, handed
    else:
        assert handed["ahead"] >= 1 and handed["own"] >= 1, handed
    (report,) = handles
    assert report["tensors"] == tensors, "each weight read once"
    (ahead,) = aheads
    assert ahead._read == {} and ahead._held == 0 and not ahead._thread.is_alive()


@pytest.mark.parametrize("ahead_bytes", [None, 1])
def test_tensors_the_model_does_not_take_are_read_ahead_and_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead_bytes: Any
) -> None:
    """A base model from a causal LM's checkpoint: `lm_head.weight` is in the checkpoint and
    never asked for. It is read ahead and held (with room for one tensor, the thread then waits
    for room and the rest are read by their callers), and the load ends all the same, with the
    model `transformers` builds from the same files, the thread gone and the GC on again."""
    import gc
    import threading

    from transformers import AutoModel

    import safetensors_staging.transformers as helper

    if ahead_bytes is not None:
        monkeypatch.setattr(helper, "_AHEAD_BYTES", ahead_bytes)
    path = small_causal_lm("qwen2", tmp_path)
    ours = from_pretrained(path, AutoModel, map=False).eval()
    reference = AutoModel.from_pretrained(path).eval()
    assert type(ours) is type(reference)
    same_state(ours, reference)
    assert not [t for t in threading.enumerate() if t.name == "from_pretrained-read-ahead"]
    assert gc.isenabled()


def test_a_stream_of_a_handle_counts_in_its_report_also_when_left_part_way(
    tmp_path: Path,
) -> None:
    """`safe_open._stream` (what the read ahead iterates): one load on the handle's backend
    whose reads are added to the handle's report when it ends, or when it is let go of
    part-way; the handle reads on after it."""
    import gc

    path = small_causal_lm("qwen2", tmp_path)
    with st.safe_open(path, framework="pt", map=False) as handle:
        names = handle.offset_keys()
        stream = handle._stream(names)
        got = [next(stream) for _ in range(3)]
        assert [name for name, _ in got] == names[:3]
        for name, tensor in got:
            assert torch.equal(tensor, handle.get_slice(name)[...]), name
        before = handle.report()["tensors"]
        assert before == 3, "the three slices; the stream counts when it ends"
        del stream
        gc.collect()
        report = handle.report()
        assert report["tensors"] == before + 3
        assert report["bytes"] == 2 * sum(t.numel() * t.element_size() for _, t in got)
        assert list(handle.get_tensor(names[5]).shape) == handle.get_slice(names[5]).get_shape()


def test_a_wrong_model_class_is_refused(minilm_dir: Path) -> None:
    from transformers import AutoModelForImageClassification

    with pytest.raises(
        ValueError, match="AutoModelForImageClassification has no model class for BertConfig"
    ):
        from_pretrained(minilm_dir, AutoModelForImageClassification)


def _tensor_parallel_worker(rank: int, world: int, path: str, out: str) -> None:
    """One rank of a 2-rank gloo group: the model with `tp_plan="auto"` through our helper and
    through `transformers`' own loader; what each rank holds, reads and computes."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
    from transformers import AutoModelForCausalLM

    import safetensors_staging.transformers as helper

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    result: dict = {"rank": rank}
    try:
        handles: list = []
        original = helper.safe_open

        class Recording(original):  # type: ignore[misc, valid-type]
            def close(self) -> None:
                handles.append(self.report())
                super().close()

        helper.safe_open = Recording
        try:
            ours = from_pretrained(
                path, AutoModelForCausalLM, model_kwargs={"tp_plan": "auto"}
            ).eval()
        finally:
            helper.safe_open = original
        reference = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto").eval()
        theirs = dict(reference.named_parameters())
        bad, row_shares, column_shares, expected = [], 0, 0, 0
        for name, param in ours.named_parameters():
            want = theirs[name]
            local = param.to_local() if isinstance(param, DTensor) else param.data
            if isinstance(param, DTensor) != isinstance(want, DTensor) or not torch.equal(
                local, want.to_local() if isinstance(want, DTensor) else want.data
            ):
                bad.append(name)
            # What this rank must read: its share of a tensor split along dimension 0 (its rows)
            # or dimension 1 (its columns of every row: on the CPU, only those); all of a
            # replicated one.
            if isinstance(param, DTensor) and param.placements in ((Shard(0),), (Shard(1),)):
                dim = param.placements[0].dim
                row_shares += dim == 0
                column_shares += dim == 1
                assert local.shape[dim] < param.shape[dim]
                expected += local.numel() * local.element_size()
            else:
                expected += param.numel() * param.element_size()
        prompt = torch.tensor([[1, 17, 42, 99, 3, 250]])
        with torch.no_grad():
            same_logits = torch.equal(ours(prompt).logits, reference(prompt).logits)
        (report,) = handles
        result.update(
            bad=bad,
            row_shares=row_shares,
            column_shares=column_shares,
            expected=expected,
            bytes_read=report["bytes_read"],
            same_logits=same_logits,
        )
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def test_tensor_parallel_ranks_read_their_share_and_compute_as_transformers_does(
    tmp_path: Path,
) -> None:
    """`model_kwargs={"tp_plan": "auto"}` on 2 gloo ranks: `transformers` shards the model as
    DTensors and indexes our lazy slices, so each rank reads only its shares: the rows of
    those split along dimension 0, the columns of those split along dimension 1; its local
    shards and the logits equal `transformers`' own tensor-parallel load."""
    import torch.multiprocessing as mp

    path = small_causal_lm("qwen2", tmp_path)
    total = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(
        _tensor_parallel_worker,
        args=(2, str(path), str(out)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "error" not in r, r
        assert r["bad"] == [] and r["same_logits"], r
        assert r["row_shares"] >= 20, (
            "q/k/v/gate/up projections, embeddings and lm_head split by rows"
        )
        assert r["column_shares"] >= 4, "o/down projections split by columns"
        assert r["bytes_read"] == r["expected"], r
        assert r["bytes_read"] < 0.65 * total, r
