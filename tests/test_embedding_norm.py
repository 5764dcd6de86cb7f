"""`model.embedding_norm` (issue 26): BLOOM's word_embeddings_layernorm, a norm of the model's norm kind right after
the token embeddings. Counted exactly, rendered only when on, applied before the first block."""

from __future__ import annotations

import pytest
import torch

from archspec.accounting import account
from archspec.codegen import generate
from archspec.spec import model_hash
from tests.tiny import tiny_spec


@pytest.mark.parametrize("norm", [{"kind": "layernorm"}, {"kind": "layernorm", "bias": False}, {"kind": "rmsnorm"}])
def test_embedding_norm_params_equal_numel_and_it_normalises_the_embeddings(norm, tmp_path):
    spec = tiny_spec("en", norm=norm, embedding_norm=True)
    off = tiny_spec("en", norm=norm)
    assert account(spec).total - account(off).total == account(off).by_component["norm"] // 3  # one more norm
    gen = generate(spec, out_dir=tmp_path)
    assert "self.tok_norm = Norm(D_MODEL)" in gen.source and "x = self.tok_norm(x)" in gen.source
    model = gen.Model().eval()
    assert sum(p.numel() for p in model.parameters()) == account(spec).total
    assert account(spec).by_component["norm"] == sum(p.numel() for n, p in model.named_parameters() if "norm" in n
                                                     and ".attn." not in n)
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.update(x=args[0]))  # returns None: args kept
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        model(idx)
        torch.testing.assert_close(seen["x"], model.tok_norm(model.tok_emb(idx)))


def test_off_by_default_renders_nothing_and_keeps_the_hash(tmp_path):
    plain, written = tiny_spec("en"), tiny_spec("en", embedding_norm=False)
    assert model_hash(plain) == model_hash(written)
    assert model_hash(tiny_spec("en", embedding_norm=True)) != model_hash(plain)
    assert "tok_norm" not in generate(plain, out_dir=tmp_path).source
