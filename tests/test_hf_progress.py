"""import-hf and export-hf show their progress (issue 49): a rich bar on stderr over the tensors read, shard by
shard, and written, silent when stderr is not a terminal; the files they write are the same with or without it."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from archspec.cli import main
from archspec.codegen import generate
from archspec.console import Tracker, byte_size
from archspec.hf import export_hf, import_hf
from archspec.spec import canonical_dict, load_spec_dict, model_hash
from archspec.train.checkpoint import save_weights

pytest.importorskip("safetensors")


class Recording(Tracker):
    """A tracker drawn on a terminal of its own (a string), that also keeps every update it was given."""

    def __init__(self, description: str = ""):
        self.out = io.StringIO()
        super().__init__(description, console=Console(file=self.out, force_terminal=True, width=200))
        self.updates: list[tuple[str | None, float, float | None]] = []

    def update(self, description=None, advance=0.0, total=None):
        self.updates.append((description, advance, total))
        super().update(description, advance, total)

    @property
    def descriptions(self) -> list[str]:
        return [d for d, _, _ in self.updates if d is not None]

    @property
    def advanced(self) -> float:
        return sum(a for _, a, _ in self.updates)


@pytest.fixture
def weights(tmp_path):
    spec = load_spec_dict({"name": "mine", "model": {
        "vocab_size": 96, "context_length": 32, "d_model": 32, "n_layers": 2, "norm": {"kind": "rmsnorm"},
        "attention": {"n_heads": 4, "n_kv_heads": 2, "positional": {"kind": "rope"}},
        "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": 64}}})
    model = generate(spec, write=False).Model()
    path = tmp_path / "mine.pt"
    save_weights(path, canonical_dict(spec), model_hash(spec), model.state_dict())
    return path


def _files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _shard(src, out, parts: int = 3) -> list[str]:
    """`src`'s model.safetensors split into `parts` shards with an index, as save_pretrained writes a large model."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    shards = [f"model-{i + 1:05d}-of-{parts:05d}.safetensors" for i in range(parts)]
    weight_map = {}
    for i, shard in enumerate(shards):
        mine = names[i::parts]
        save_file({n: tensors[n] for n in mine}, str(out / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in mine})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    return shards


def test_export_and_import_show_each_tensor_and_shard_and_write_the_same_files(weights, tmp_path):
    with Recording("reading the checkpoint") as shown:
        summary = export_hf(str(weights), tmp_path / "shown", tracker=shown)
    export_hf(str(weights), tmp_path / "quiet")  # no tracker: the default shows nothing
    assert _files(tmp_path / "shown") == _files(tmp_path / "quiet")  # byte for byte
    tensors = len(json.loads((tmp_path / "shown" / "model.safetensors").read_bytes()[8:][
        :int.from_bytes((tmp_path / "shown" / "model.safetensors").read_bytes()[:8], "little")])) - 1  # less metadata
    assert shown.advanced == tensors and (None, 0.0, tensors) in [(None, a, t) for _, a, t in shown.updates]
    assert shown.descriptions[0].startswith("reading mine.pt (")
    assert f"converting to {summary['model_type']}" in shown.descriptions
    assert shown.descriptions[-1].startswith(f"writing model.safetensors ({tensors} tensors, ")
    screen = shown.out.getvalue()
    assert "━" in screen and f"{tensors}/{tensors}" in screen and "writing model.safetensors" in screen

    with Recording() as single:  # one file: named with its size
        import_hf(tmp_path / "shown", tmp_path / "one.yaml", tmp_path / "one.pt", tracker=single)
    size = (tmp_path / "shown" / "model.safetensors").stat().st_size
    assert single.advanced == tensors and f"reading model.safetensors ({byte_size(size)})" in single.descriptions

    shards = _shard(tmp_path / "shown", tmp_path / "sharded")
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    with Recording("reading the weights") as read:
        import_hf(tmp_path / "sharded", tmp_path / "A" / "m.yaml", tmp_path / "A" / "m.pt", tracker=read)
    import_hf(tmp_path / "sharded", tmp_path / "B" / "m.yaml", tmp_path / "B" / "m.pt")
    assert read.advanced == tensors and read.updates[0][2] == tensors  # the total from the index, before any read
    for i, shard in enumerate(shards, 1):
        assert any(d.startswith(f"reading {shard} (shard {i} of {len(shards)}, ") for d in read.descriptions)
    assert read.descriptions[-1].startswith("writing m.pt (")
    assert "writing m.pt" in read.out.getvalue()
    # the same spec (its header names where it was written) and the same checkpoint, byte for byte
    a, b = (tmp_path / "A" / "m.yaml").read_text(), (tmp_path / "B" / "m.yaml").read_text()
    assert a.replace(str(tmp_path / "A"), str(tmp_path / "B")) == b
    assert (tmp_path / "A" / "m.pt").read_bytes() == (tmp_path / "B" / "m.pt").read_bytes()


def test_the_commands_print_no_bar_when_stderr_is_not_a_terminal(weights, tmp_path, capsys):
    assert main(["export-hf", str(weights), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr()
    assert "━" not in out.err and "writing" not in out.err and "→" in out.out
    assert main(["import-hf", str(tmp_path / "out"), "-o", str(tmp_path / "s.yaml"), "--checkpoint",
                 str(tmp_path / "s.pt"), "--json"]) == 0
    out = capsys.readouterr()
    assert "━" not in out.err and "reading" not in out.err and json.loads(out.out)["checkpoint"].endswith("s.pt")
