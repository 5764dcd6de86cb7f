"""Two-way interop with HF transformers: a transformers model directory ↔ a spec and a weights checkpoint.

    archspec import-hf PATH -o SPEC.yaml [--checkpoint OUT.pt]      config.json (+ safetensors, tokenizer) → spec
    archspec export-hf RUN_ID | CHECKPOINT -o DIR                    → config.json + model.safetensors (+ tokenizer)

Each kind maps its own config fields and weights (`from_hf`, `to_hf`, `hf_weights` on the units in
archspec/kinds; the contract is archspec.kinds.hf); `types` says what each transformers model type is made of;
`convert` assembles the model (embeddings, layer prefixes, final norm, LM head); `io` reads and writes the files.
Nothing needs transformers itself: configs are JSON and weights safetensors. The weights checkpoint format is
archspec.train.checkpoint's (`save_weights`, `load_weights`).
"""

from __future__ import annotations

import os
import warnings
import re
from pathlib import Path
from typing import Any

import torch

from archspec.console import NULL_TRACKER, Tracker, byte_size
from archspec.errors import Caution, UserError, printable
from archspec.hf import io
from archspec.hf.convert import (config_from_spec, hf_type, left_out_layers, mtp_prefixes, spec_from_config,
                                 state_from_hf, state_to_hf, weight_map)
from archspec.kinds.hf import HFUnsupported

__all__ = ["import_hf", "export_hf", "spec_from_config", "config_from_spec", "state_from_hf", "state_to_hf",
           "weight_map", "HFUnsupported", "expected_shapes"]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-_")[:64]
    return slug or "imported"


def expected_shapes(spec) -> dict[str, torch.Size]:
    """The generated module's state_dict shapes, from the module built on the meta device (no memory)."""
    from archspec.codegen import generate

    with torch.device("meta"):
        model = generate(spec, write=False).Model()
    return {k: v.shape for k, v in model.state_dict().items()}


def _refuse_existing(path: Path | None, what: str) -> Path | None:
    """The output path, confined (archspec.paths.new_output): no link, nothing there, its directory resolved."""
    from archspec.paths import new_output

    return None if path is None else new_output(path, what)


def import_hf(path: str | os.PathLike, spec_out: str | os.PathLike, checkpoint_out: str | os.PathLike | None = None,
              name: str | None = None, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    """Write SPEC.yaml (and a weights checkpoint) from a transformers config.json or model directory. Nothing is
    written unless everything maps. Returns a summary: name, model_type, spec path, checkpoint path, params.
    `tracker` (archspec.console.Tracker): the tensors read, shard by shard, then the checkpoint's write."""
    import yaml

    from archspec.spec import canonical_dict, load_spec_dict, model_hash
    from archspec.cache import atomic_write_text
    from archspec.train.checkpoint import save_weights

    spec_out = Path(spec_out)
    checkpoint_out = Path(checkpoint_out) if checkpoint_out is not None else None
    spec_out = _refuse_existing(spec_out, "spec")
    checkpoint_out = _refuse_existing(checkpoint_out, "checkpoint")
    cfg_path = io.config_path(path)
    data = io.read_json(cfg_path, "a transformers config.json")
    spec_dict = spec_from_config(data, printable(cfg_path), _slug(name or spec_out.stem))
    try:
        spec = load_spec_dict(spec_dict, origin=f"{printable(cfg_path)} (as an archspec spec)")
    except UserError as e:  # a config's value beyond the spec's bounds: one line, whatever the spec's format
        if not e.problems:
            raise
        raise UserError(f"{e}: " + "; ".join(printable(p, 300) for p in e.problems[:3])
                        + ("; ..." if len(e.problems) > 3 else "")) from None

    params = None
    if checkpoint_out is not None:
        from archspec.memory import check_memory

        check_memory(spec)
        tensors = io.read_tensors(cfg_path.parent, tracker)
        hf = hf_type(data.get("model_type"), printable(cfg_path), data)
        if spec.model.mtp is not None and not any(k.startswith(p) for p in mtp_prefixes(spec.model, hf)
                                                  for k in tensors):
            # transformers writes num_nextn_predict_layers (default 1) but saves no MTP layer: nothing to import
            warnings.warn(Caution(f"{printable(cfg_path.parent)}: {hf.mtp_layers}: {spec.model.mtp.depth}, but the "
                                  "checkpoint holds none of those layers' tensors (transformers saves none): imported "
                                  "without model.mtp"))
            spec_dict["model"].pop("mtp")
            spec = load_spec_dict(spec_dict, origin=f"{printable(cfg_path)} (as an archspec spec)")
        state = state_from_hf(spec.model, hf, tensors, printable(cfg_path.parent), expected_shapes(spec),
                              skip_layers=left_out_layers(hf, data))
        tokenizer = io.read_tokenizer(cfg_path.parent)
        size = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
        tracker.update(f"writing {printable(checkpoint_out.name, 60)} ({len(state):,} tensors, {byte_size(size)})")
        _refuse_existing(checkpoint_out, "checkpoint")  # again, at the moment of writing
        save_weights(checkpoint_out, canonical_dict(spec), model_hash(spec), state, tokenizer,
                     source=str(cfg_path.parent))
        params = sum(t.numel() for t in {id(t): t for t in state.values()}.values())  # a tied matrix once

    model_type = data.get("model_type")
    header = (f"# Imported from {printable(cfg_path)} (transformers model_type {model_type}) by `archspec import-hf`.\n"
              + (f"# Weights: {printable(checkpoint_out)} (`archspec train {printable(spec_out)} --init-from "
                 f"{printable(checkpoint_out)}`).\n" if checkpoint_out is not None else ""))
    body = yaml.safe_dump({"name": spec.name, "model": canonical_dict(spec)["model"]}, sort_keys=False)
    try:
        _refuse_existing(spec_out, "spec")  # again, at the moment of writing
        atomic_write_text(spec_out, header + body)
    except OSError as e:
        raise UserError(f"{printable(spec_out)}: cannot write the spec: {e.strerror or e}") from None
    return {"name": spec.name, "model_type": model_type, "spec": str(spec_out),
            "checkpoint": str(checkpoint_out) if checkpoint_out else None, "params": params}


def load_source(source: str, registry_url: str | None = None) -> tuple[Any, dict[str, Any], Path]:
    """A weights checkpoint, a training checkpoint or run directory, or a run id (its checkpoint in the registry):
    (spec, weights as archspec.train.checkpoint.load_weights returns them, the file read)."""
    from archspec.spec import load_spec_dict
    from archspec.train.checkpoint import load_weights, resolve

    path = Path(source)
    if not path.exists():
        path = _run_checkpoint(source, registry_url)
    path = resolve(path)
    weights = load_weights(path)
    spec = load_spec_dict(weights["spec"], origin=f"{printable(path)}: spec")
    expected = expected_shapes(spec)
    got = {k: tuple(v.shape) for k, v in weights["model"].items()}
    if got != {k: tuple(v) for k, v in expected.items()}:
        diff = sorted(set(got) ^ set(expected)) or [k for k in got if got[k] != tuple(expected[k])]
        raise UserError(f"{printable(path)}: model weights do not fit the spec stored with them",
                        [printable(k, 120) for k in diff[:10]])
    return spec, weights, path


def _run_checkpoint(run_id: str, registry_url: str | None) -> Path:
    from archspec.registry import Registry, default_url

    url = registry_url or default_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise UserError(f"{printable(run_id, 80)}: no such checkpoint file, and no registry at {url} to look up a run")
    with Registry(url) as reg:
        return reg.run_checkpoint(run_id, "export")[1]


def export_hf(source: str, out_dir: str | os.PathLike, registry_url: str | None = None,
              tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    """Write a transformers model directory (config.json, model.safetensors, generation_config.json and the
    tokenizer files) that AutoModelForCausalLM.from_pretrained loads with the same logits and AutoTokenizer /
    pipeline("text-generation") load with archspec's own ids. Refuses what no transformers model type expresses, by
    field. `tracker` (archspec.console.Tracker): the checkpoint's read, the tensors converted, then the write."""
    where = Path(source)
    tracker.update(f"reading {printable(where.name or source, 60)}"
                   + (f" ({byte_size(where.stat().st_size)})" if where.is_file() else ""))
    spec, weights, path = load_source(source, registry_url)
    hf, config = config_from_spec(spec)
    tracker.update(f"converting to {hf.model_type}")
    tensors = state_to_hf(spec.model, hf, weights["model"])
    tokenizer, generation = _tokenizer_files(spec, weights, path)
    tracker.update(f"preparing {len(tensors):,} tensors", total=len(tensors))
    io.write_model_dir(Path(out_dir), config, tensors, tokenizer, generation, tracker)
    return {"name": spec.name, "model_type": hf.model_type, "dir": str(out_dir), "source": str(path),
            "tokenizer": bool(tokenizer), "params": sum(t.numel() for t in tensors.values())}


def _tokenizer_files(spec, weights: dict[str, Any], path: Path) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The tokenizer files to export and the generation defaults (None: none to write). A weights checkpoint carries
    the files import-hf read beside the model, written back as they came (none: none written; its recipe's
    tokenizer is not the model's). A training checkpoint's tokenizer is the run's own (`checkpoint_tokenizer`), whose
    unit writes itself as transformers files (`hf_files`); generation then stops at its EOS, which also pads. The
    model's vocab_size may exceed the tokenizer's ids (a padded vocabulary): the ids past them keep their rows in the
    weights, have no token, and decode to nothing, as in `archspec sample`."""
    from archspec.train.checkpoint import WEIGHTS_FORMAT
    from archspec.train.tokenizer import checkpoint_tokenizer

    if weights["format"] == WEIGHTS_FORMAT:
        return dict(weights["tokenizer"]), None
    try:
        tokenizer = checkpoint_tokenizer(path, weights.get("tokenizer_state"), spec)
    except UserError as e:  # a run saved before tokenizers travelled with checkpoints, its tokenizer.json gone
        warnings.warn(Caution(f"{e}; the model is exported without a tokenizer"))
        return {}, None
    files = tokenizer.hf_files(spec.model.context_length)
    eos = tokenizer.eos_id
    return files, {"eos_token_id": eos, "pad_token_id": eos, "bos_token_id": None, "do_sample": False}
