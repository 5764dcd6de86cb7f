"""`archspec sample RUN_ID | CHECKPOINT | SPEC --prompt TEXT`: stream generated text, optionally speculative."""

from __future__ import annotations

import sys
import time

import click

from archspec.cli.options import FiniteFloat, device_option, registry_option, set_option
from archspec.console import echo, terminal_text
from archspec.errors import UserError, printable

DEFAULT_NEW_TOKENS = 200
# archspec.runtime.decode.DECODE_MODES, spelled here so that `sample --help` loads no torch (a test keeps them equal)
DECODE_MODES = ("none", "whole", "cudagraphs")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source", metavar="RUN_ID|CHECKPOINT|SPEC")
@click.option("--prompt", default="", show_default=False, help="Text to continue (default: empty, i.e. from EOS).")
@click.option("--max-new-tokens", type=click.IntRange(1, 1 << 20), default=None,
              help=f"Tokens to generate at most [default: {DEFAULT_NEW_TOKENS}, or what the context has room for].")
@click.option("--temperature", type=FiniteFloat(0.0, 100.0), default=1.0, show_default=True,
              help="0: greedy (argmax).")
@click.option("--top-k", type=click.IntRange(1, 1 << 24), default=None, help="Sample among the k most likely tokens.")
@click.option("--top-p", type=FiniteFloat(0.0, 1.0, min_open=True), default=None,
              help="Sample among the smallest set of tokens whose probability reaches p (nucleus).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Sampling seed (and the random weights of a bare SPEC).")
@device_option
@click.option("--dtype", type=click.Choice(("auto", "fp32", "bf16")), default="auto", show_default=True,
              help="Weights and KV cache; auto: bf16 on a CUDA device with bf16, else fp32.")
@click.option("--quantize", type=click.Choice(("int8", "int4")), default=None,
              help="Quantize the weights before generating, as `archspec quantize` does (needs archspec[quant] for "
                   "int8); a quantized checkpoint is read as it is.")
@click.option("--draft", metavar="RUN_OR_CHECKPOINT|mtp",
              help="Speculative decoding: a smaller model with the same tokenizer drafts, the model verifies; mtp: the "
                   "model's own multi-token prediction modules draft (model.mtp; greedy, --temperature 0), up to "
                   "model.mtp.depth tokens a round.")
@click.option("--draft-tokens", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Tokens the draft proposes per verify forward.")
@click.option("--compile", "compile_mode", type=click.Choice(DECODE_MODES), default="none", show_default=True,
              help="Decode each token after the prompt through one compiled graph of the model's step: whole "
                   "(torch.compile), cudagraphs (CUDA graphs; elsewhere whole). The prompt's prefill stays eager; the "
                   "compile happens at the second token. Refused (eager, with the reason) for MoE, --draft and "
                   "quantized weights.")
@click.option("--media", "media_path", metavar="FILE.safetensors", default=None,
              help="Media for a model with media input (model.media): a safetensors file whose tensor `media` is "
                   "items × tokens × width; each `<media>` in --prompt marks where an item sits, one per item.")
@set_option
@registry_option
@click.option("-q", "--quiet", is_flag=True, help="Only the text: no summary line on stderr.")
def sample_cmd(source: str, prompt: str, max_new_tokens: int | None, temperature: float, top_k: int | None,
               top_p: float | None, seed: int, device: str, dtype: str, quantize: str | None, draft: str | None,
               draft_tokens: int, compile_mode: str, media_path: str | None,
               overrides: tuple[str, ...], registry_url: str | None, quiet: bool) -> None:
    """Generate text from a run (its id, run directory or checkpoint), a weights checkpoint (import-hf), or a bare
    SPEC with random weights.

    Tokens are printed as they come; generation stops at EOS or after --max-new-tokens. The model's own KV cache and
    sampling rule (in its generated module) do the work. Prompt + --max-new-tokens must fit context_length, unless
    every layer attends within a window and positions are relative (RoPE) or absent: such a model's caches roll and
    it generates past its context. A summary (tokens, tok/s, time to first token, KV cache bytes; with --draft the
    acceptance rate) goes to stderr. --set applies to a bare SPEC only; --registry is where RUN_ID is looked up."""
    import torch

    from archspec.accounting import kv_cache_bytes, kv_cache_bytes_per_token
    from archspec.kinds.attention import past_context_refusal
    from archspec.sample import (
        SpeculativeStats,
        TextStream,
        check_length,
        encode_prompt,
        load_model,
        mtp_speculative_stream,
        resolve_decode_compile,
        same_tokenizer,
        speculative_stream,
    )
    from archspec.train.distributed import resolve_device

    dev = resolve_device(device)
    if dtype == "auto":  # a quantized model computes in fp32
        dtype = "bf16" if dev.type == "cuda" and torch.cuda.is_bf16_supported() and not quantize else "fp32"
    loaded = load_model(source, device=dev, dtype=dtype, seed=seed, registry_url=registry_url, overrides=overrides,
                        quantize=quantize)
    media = None
    if media_path is not None:
        from archspec.media import MARKER_TEXT, encode_with_markers, load_media

        media = load_media(media_path, loaded.spec.model)
        if draft is not None:
            raise UserError("--media: speculative decoding (--draft) takes no media; leave one out")
        marker = loaded.spec.model.media.marker_id
        ids = encode_with_markers(lambda t: loaded.tokenizer.encode_batch([t])[0].tolist(), prompt, marker)
        if ids.count(marker) != media.size(0):
            raise UserError(f"--media {printable(media_path)}: {media.size(0)} items, and --prompt marks "
                            f"{ids.count(marker)} places for them ({MARKER_TEXT}); give one {MARKER_TEXT} per item")
        idx = torch.tensor([ids], dtype=torch.long, device=dev)
        media = media.to(device=dev, dtype=next(loaded.model.parameters()).dtype)
    else:
        idx = encode_prompt(loaded.tokenizer, prompt, dev)
    past_context = past_context_refusal(loaded.spec.model) is None  # every layer windowed, relative positions
    if max_new_tokens is None:  # not asked for: the default, or as many as fit in the context
        room = DEFAULT_NEW_TOKENS if past_context else loaded.spec.model.context_length - idx.size(1)
        max_new_tokens = max(1, min(DEFAULT_NEW_TOKENS, room))
    check_length(loaded.spec, idx.size(1), max_new_tokens)
    drafter = None
    self_draft = draft == "mtp"  # the model's own MTP modules (archspec.sample.mtp_speculative_stream)
    if self_draft:
        if loaded.spec.model.mtp is None:
            raise UserError(f"--draft mtp: {printable(source)} has no multi-token prediction modules (model.mtp is "
                            "not set); train a model with model.mtp: {depth: D}, or draft with another model")
        if temperature != 0:
            raise UserError(f"--draft mtp: decodes greedily; pass --temperature 0 (got {temperature})")
    elif draft is not None:
        drafter = load_model(draft, device=dev, dtype=dtype, seed=seed, registry_url=registry_url)
        if not same_tokenizer(loaded.tokenizer, drafter.tokenizer):
            raise UserError(f"--draft {printable(draft)}: its tokenizer ({drafter.tokenizer.kind}) is not the model's "
                            f"({loaded.tokenizer.kind}); a draft must share the tokenizer")
        if drafter.spec.model.vocab_size != loaded.spec.model.vocab_size:
            raise UserError(f"--draft {printable(draft)}: its vocabulary has {drafter.spec.model.vocab_size} ids, the "
                            f"model's {loaded.spec.model.vocab_size}; a draft proposes the model's own token ids")
        try:
            check_length(drafter.spec, idx.size(1), max_new_tokens)
        except UserError as e:
            raise UserError(f"--draft {printable(draft)}: {e}") from None

    decode_mode, decode_reason = resolve_decode_compile(compile_mode, loaded.spec, dev,
                                                        draft=drafter is not None or self_draft,
                                                        quantized=loaded.quantized is not None)
    decode = None
    if decode_mode != "none":
        from archspec.runtime import DecodeStep

        decode = DecodeStep(loaded.model, decode_mode)
    if compile_mode != "none" and not quiet:
        echo(f"decode compile: {decode_mode} ({printable(decode_reason)})", err=True)

    generator = torch.Generator(dev).manual_seed(seed)
    eos = loaded.tokenizer.eos_id
    stats = SpeculativeStats()
    if self_draft:
        tokens = mtp_speculative_stream(loaded.model, idx, max_new_tokens, depth=min(draft_tokens,
                                        loaded.spec.model.mtp.depth), eos_id=eos, stats=stats)
    elif drafter is None and decode is None:
        media_arg = {} if media is None else {"media": media}  # a text-only model's stream takes no media
        tokens = (int(t) for t in loaded.model.stream(idx, max_new_tokens, temperature, top_k, top_p, eos, generator,
                                                      **media_arg))
    elif drafter is None:  # the model's stream() with the compiled step: archspec.runtime's loop, which it calls
        from archspec.runtime import stream

        context = None if past_context else loaded.spec.model.context_length
        tokens = (int(t) for t in stream(loaded.model, idx, max_new_tokens, temperature, top_k, top_p, eos, generator,
                                         context_length=context, decode=decode, media=media))
    else:
        tokens = speculative_stream(loaded.model, drafter.model, idx, max_new_tokens, k=draft_tokens,
                                    temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos,
                                    generator=generator, stats=stats)
    text = TextStream(loaded.tokenizer)
    out = sys.stdout
    t0 = time.perf_counter()
    first = None
    count, stopped = 0, False
    for token in tokens:
        count += 1
        if first is None:
            first = time.perf_counter() - t0
        if token == eos:
            stopped = True
            break
        out.write(terminal_text(text.push(token)))
        out.flush()
    out.write(terminal_text(text.flush()) + "\n")
    out.flush()
    seconds = time.perf_counter() - t0
    if quiet:
        return
    m = loaded.spec.model
    positions = idx.size(1) + max_new_tokens  # what the cache was sized for
    state = kv_cache_bytes(m, positions, dtype)
    # A model none of whose layers keeps keys and values (every layer a fixed-size state) has no KV cache: its decoding state is the same size at any position.
    cache = (f"KV cache {state:,} bytes ({positions} positions, {dtype})" if kv_cache_bytes_per_token(m, dtype)
             else f"decoding state {state:,} bytes (fixed at any length, {dtype})")
    line = (f"{count} tokens in {seconds:.2f} s ({count / seconds:,.1f} tok/s) · first token after "
            f"{1000 * (first or 0):.0f} ms · {cache} · {printable(loaded.what)}")
    if idx.size(1) + count > m.context_length:
        line += (f" · past context_length {m.context_length}: every layer reads a bounded distance back "
                 "(a window, or a fixed-size state), so its caches stay bounded")
    if decode is not None:
        line += f" · decoded through a compiled step ({decode_mode}; its first call {decode.compile_s:.1f} s)"
    if stopped:
        line += " · stopped at EOS"
    if drafter is not None or self_draft:
        line += (f" · {'MTP ' if self_draft else ''}draft acceptance {100 * stats.acceptance_rate:.1f}% ({stats.accepted}/{stats.drafted}), "
                 f"{count / max(1, stats.target_forwards):.2f} tokens per target forward")
    echo(line, err=True)
