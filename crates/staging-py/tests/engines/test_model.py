"""A real model on what the package loaded: all-MiniLM-L6-v2 built by `transformers` from its
config, its state dict filled from `safetensors_staging.load_file`, against the same model
loaded by `transformers` itself; the sentence embeddings must be equal to the bit."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import safetensors_staging as st

SENTENCES = [
    "Safetensors checkpoints load onto the device in bounded memory.",
    "The quick brown fox jumps over the lazy dog.",
    "A read error names the tensor, the file and the offset.",
]


def embed(model, tokenizer) -> torch.Tensor:
    """Mean-pooled, normalized embeddings, as sentence-transformers computes them."""
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def test_minilm_embeddings_equal_to_the_bit(minilm_dir: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    reference = AutoModel.from_pretrained(minilm_dir).eval()

    config = AutoConfig.from_pretrained(minilm_dir)
    model = AutoModel.from_config(config).eval()
    # Random weights first: equal embeddings can only come from the loaded ones.
    assert not torch.equal(embed(model, tokenizer), embed(reference, tokenizer))
    weights = st.load_file(minilm_dir)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # `position_ids` is in the file but no longer a persistent buffer of the model.
    assert missing == [] and set(unexpected) <= {"embeddings.position_ids"}, (missing, unexpected)
    del weights  # the model holds its own copies now; the loaded memory goes back

    got, want = embed(model, tokenizer), embed(reference, tokenizer)
    assert got.shape == (3, 384)
    assert torch.equal(got, want)
    # And the model's parameters are the file's, bit for bit.
    for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(p, q), name
