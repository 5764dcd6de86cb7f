"""Loading a model to run it: a registry run, a checkpoint (training, weights or quantized), a run directory, or a
bare spec with random weights, with its tokenizer (stored in the checkpoint: nothing is read from the data cache).
One module for every reader: sampling (archspec.sample), quantization (archspec.quantize), the capability probe
(archspec.ablate.probe) and the benchmarks.

    loaded = load_model("runs/llama-like-tiny-1a2b3c4d5e6f", device="cpu")
    loaded.spec, loaded.model, loaded.tokenizer, loaded.what
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from archspec import codegen
from archspec.errors import UserError, printable
from archspec.spec import Spec, load_spec, load_spec_dict
from archspec.train.checkpoint import FILENAME, QUANTIZED_FORMAT, WEIGHTS_FORMAT, load_any
from archspec.train.tokenizer import Tokenizer, checkpoint_tokenizer

SPEC_SUFFIXES = (".yaml", ".yml")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Loaded:
    spec: Spec
    model: nn.Module  # the generated Model, in eval mode, on its device and dtype
    module: ModuleType  # the generated module
    tokenizer: Tokenizer
    what: str  # how it was found, for messages: "checkpoint PATH (step N)", "spec PATH (random weights)"
    quantized: str | None = None  # the weights' scheme (int8 | int4) when quantized, read so or here


# ── finding the model ────────────────────────────────────────────────────────────────────────────────────────────


def resolve_source(source: str, registry_url: str | None = None) -> tuple[str, Path]:
    """("spec", path) or ("checkpoint", path) for SOURCE: a spec file (.yaml/.yml), a checkpoint file, a run directory,
    or a run id (or unique prefix) in the registry, whose checkpoint artifact is used."""
    path = Path(source)
    if path.is_dir():
        ckpt = path / FILENAME
        if not ckpt.is_file():
            raise UserError(f"{printable(source)}: a directory without {FILENAME}; expected a run directory")
        return "checkpoint", ckpt
    if path.exists():
        return ("spec" if path.suffix in SPEC_SUFFIXES else "checkpoint"), path
    if path.suffix in SPEC_SUFFIXES or path.suffix == ".pt" or "/" in source or "\\" in source:
        raise UserError(f"{printable(source)}: no such file")
    return "checkpoint", _run_checkpoint(source, registry_url)


def _run_checkpoint(run_id: str, registry_url: str | None) -> Path:
    from archspec.registry import Registry, default_url

    url = registry_url or default_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise UserError(f"{printable(run_id)}: not a file, and no registry at {printable(url)} to look it up as a run "
                        "id (pass a spec, a checkpoint, a run directory, or --registry)")
    registry = Registry(url)
    try:
        return registry.run_checkpoint(run_id, "sample from")[1]
    finally:
        registry.close()


def load_model(source: str, *, device: str | torch.device = "cpu", dtype: str = "fp32", seed: int = 0,
               registry_url: str | None = None, overrides: tuple[str, ...] = (), quantize: str | None = None) -> Loaded:
    """The model and tokenizer SOURCE names (see `resolve_source`): a training checkpoint, a weights checkpoint
    (`archspec import-hf --checkpoint`: the model and its transformers tokenizer files), or a quantized checkpoint
    (`archspec quantize`). A bare spec gets random weights drawn with `seed` (a smoke test of the spec); its tokenizer
    is the one its recipe asks for. `quantize` (int8 | int4): the weights quantized here, as `archspec quantize`
    would (its default group size; the embedding and head kept)."""
    kind, path = resolve_source(source, registry_url)
    quantized = None
    if kind == "spec":
        spec = load_spec(path, overrides)
        generated = codegen.generate(spec, write=False)
        torch.manual_seed(seed)
        model = generated.Model()
        tokenizer = _spec_tokenizer(spec)
        what = f"spec {path} (random weights, seed {seed})"
    else:
        if overrides:
            raise UserError("--set applies to a spec; a checkpoint's model is the one it was trained as")
        state = load_any(path)
        weights_only = state["format"] == WEIGHTS_FORMAT
        try:
            spec = load_spec_dict(state["spec"], origin=f"{path} (its spec)")
        except UserError as e:
            raise UserError(f"{path}: the checkpoint's spec is not valid here: {e}", e.problems) from None
        generated = codegen.generate(spec, write=False)
        model = generated.Model()
        if state["format"] == QUANTIZED_FORMAT:
            from archspec.quant.model import load_quantized_model

            quantized = load_quantized_model(model, spec, state, str(path))
        else:
            try:
                model.load_state_dict(state["model"])
            except (RuntimeError, KeyError) as e:
                raise UserError(f"{path}: model weights do not fit the spec they were saved with",
                                str(e).strip().splitlines()[:10]) from None
        if quantized is not None:
            files = state.get("tokenizer_files") or {}
            tokenizer = (_weights_tokenizer(path, files) if files
                         else _checkpoint_tokenizer(path, state, spec))
            what = (f"{quantized.scheme} checkpoint {path}" + (f" (group size {quantized.group_size})"
                                                              if quantized.group_size else ""))
        elif weights_only:
            tokenizer = _weights_tokenizer(path, state["tokenizer"])
            what = f"weights checkpoint {path}" + (f" (from {state['source']})" if state["source"] != str(path) else "")
        else:
            tokenizer = _checkpoint_tokenizer(path, state, spec)
            what = f"checkpoint {path} (step {state['step']})"
    if tokenizer.vocab_size > spec.model.vocab_size:
        raise UserError(f"{what}: the {tokenizer.kind} tokenizer has {tokenizer.vocab_size} ids but the model only "
                        f"{spec.model.vocab_size}")
    if (quantized is not None or quantize) and dtype != "fp32":
        raise UserError(f"--dtype {dtype}: a quantized model keeps its int8/int4 weights and computes in fp32; "
                        "pass --dtype fp32")
    if quantized is not None and quantize:
        raise UserError(f"--quantize {quantize}: {path} is quantized already ({quantized.scheme})")
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    if quantize:
        from archspec.quant.model import apply_plan, quant_plan

        try:
            plan = quant_plan(model, spec, quantize)
        except UserError as e:  # no default group size: `archspec quantize --group-size` makes a file to sample
            if "none of the group sizes" not in str(e):
                raise
            raise UserError(f"--quantize {quantize}: {str(e).split('; pass --group-size')[0]}; write a checkpoint "
                            f"with `archspec quantize SOURCE --scheme {quantize} --group-size G` and sample that") \
                from None
        apply_plan(model, plan)
        what += f", quantized to {quantize}" + (f" (group size {plan.group_size})" if plan.group_size else "")
    scheme = quantize or (quantized.scheme if quantized is not None else None)
    return Loaded(spec, model, generated.module, tokenizer, what, scheme)


def _spec_tokenizer(spec: Spec) -> Tokenizer:
    tok = spec.train.data.tokenizer
    if not tok.reads_corpus:  # built from nothing (the byte tokenizer)
        return tok.build(None, None)
    # A BPE tokenizer is trained on the recipe's corpus (once, then read from the cache), exactly as training does.
    from archspec.cache import cache_dir
    from archspec.train.data import open_corpus
    from archspec.train.tokenizer import build_tokenizer

    return build_tokenizer(tok, open_corpus(spec.train.data.corpus), cache_dir())


def _checkpoint_tokenizer(path: Path, state: dict, spec: Spec) -> Tokenizer:
    return checkpoint_tokenizer(path, state.get("tokenizer"), spec)


class FileTokenizer:
    """A transformers tokenizer as a weights checkpoint carries it (tokenizer.json and its companions, stored by
    `archspec import-hf`): prompts are encoded as the model's own tokenizer encodes them (its post-processor adds a
    BOS where the model expects one); generation stops at the EOS token its tokenizer_config.json or
    special_tokens_map.json names (none named: no stop before --max-new-tokens)."""

    kind = "hf"

    def __init__(self, hf_tokenizer, eos_id: int | None, identity: str):
        self._hf, self.eos_id, self.identity = hf_tokenizer, eos_id, identity
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list:
        import numpy as np

        return [np.asarray(e.ids, dtype=np.int64) for e in self._hf.encode_batch(texts, add_special_tokens=True)]

    def decode(self, ids) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=True)


def _weights_tokenizer(path: Path, files: dict[str, str]) -> Tokenizer:
    import hashlib
    import json

    from tokenizers import Tokenizer as HFTokenizer

    if "tokenizer.json" not in files:
        raise UserError(f"{path}: a weights checkpoint without a tokenizer (import-hf stores tokenizer.json when it "
                        "lies beside the config); sampling needs the model's tokenizer")
    try:
        hf = HFTokenizer.from_str(files["tokenizer.json"])
    except Exception as e:  # the tokenizers library raises its own exception types
        raise UserError(f"{path}: its tokenizer.json does not load: {printable(str(e), 200)}") from None
    eos_id = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            eos = json.loads(files.get(name, "{}")).get("eos_token")
        except (ValueError, AttributeError):
            raise UserError(f"{path}: its {name} is not a JSON object") from None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and hf.token_to_id(eos) is not None:
            eos_id = hf.token_to_id(eos)
            break
    identity = hashlib.sha256(files["tokenizer.json"].encode("utf-8")).hexdigest()
    return FileTokenizer(hf, eos_id, identity)  # type: ignore[return-value]
