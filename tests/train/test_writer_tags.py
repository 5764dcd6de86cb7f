"""The tags the training loop writes itself are exactly `WRITER_TAGS`: the CLI refuses to set them, a restart
replaces them, and reaping by pid reads its identity tags among them."""

from __future__ import annotations

from archspec.registry.values import WRITER_IDENTITY, writer_identity
from archspec.registry.writes import WRITER_TAGS
from archspec.train.loop import Trainer


def test_run_info_writes_exactly_the_writer_tags(make_spec, cache, tmp_path):
    trainer = Trainer(make_spec(steps=2), device="cpu", cache=cache, compile=False, run_dir=tmp_path / "run")
    tags = trainer.run_info().tags
    optional = {"repeat_of"}  # only for a repeat (run id != experiment id)
    assert set(tags) - optional == set(WRITER_TAGS) - optional
    assert set(tags) >= set(WRITER_IDENTITY) and {k: tags[k] for k in WRITER_IDENTITY} == writer_identity()
