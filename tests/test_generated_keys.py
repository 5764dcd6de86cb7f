"""Every committed preset's generated model keeps its state_dict: the same keys with the same shapes as the generated
files had before the generated code was restructured (tests/fixtures/generated_state_dict_keys.json was written from
main's generated/ at c4d4276, before any of that change). Old checkpoints, HF exports and `--init-from` read these
names. Rendered here from specs/ (not read from generated/), on the meta device: no weights are made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from archspec.codegen import generate
from archspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
PINNED = json.loads((ROOT / "tests" / "fixtures" / "generated_state_dict_keys.json").read_text())


def test_every_committed_preset_is_pinned():
    assert sorted(PINNED) == sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_generated_state_dict_keeps_its_keys_and_shapes(name):
    gen = generate(load_spec(ROOT / "specs" / f"{name}.yaml"), write=False)
    with torch.device("meta"):
        model = gen.Model()
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == PINNED[name]
