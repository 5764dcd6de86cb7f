"""Compiled decode (issue 32): `archspec sample --compile`, archspec.runtime.decode.DecodeStep, and the fallbacks
of archspec.sample.resolve_decode_compile with their reasons.

Two tests compile (tens of seconds each on CPU) and are marked slow: a dense model's greedy tokens through one graph
over every step and two prompt lengths (the cudagraphs step's code, without CUDA graphs on a CPU), and the CLI asked
for cudagraphs on CPU (whole, saying why) with a windowed model decoding past its window and its context. The rest
decide without compiling."""

from __future__ import annotations

import pytest
import torch

from archspec import codegen
from archspec.cli import main
from archspec.cli.sample import DECODE_MODES as CLI_MODES
from archspec.runtime import DECODE_MODES, DecodeStep, stream
from archspec.sample import resolve_decode_compile
from tests.train.test_sample import _sample, _spec_file

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
MOE = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 32}}}


def test_the_cli_spells_the_runtimes_modes():
    assert CLI_MODES == DECODE_MODES == ("none", "whole", "cudagraphs")
    with pytest.raises(ValueError, match="expected whole or cudagraphs"):
        DecodeStep(torch.nn.Linear(1, 1), "none")


def test_modes_resolve_with_their_reasons(make_spec):
    spec = make_spec()
    assert resolve_decode_compile("none", spec, CPU) == ("none", "--compile none")
    assert resolve_decode_compile("whole", spec, CPU) == ("whole", "--compile whole")
    assert resolve_decode_compile("cudagraphs", spec, CUDA) == ("cudagraphs", "--compile cudagraphs")
    mode, reason = resolve_decode_compile("cudagraphs", spec, CPU)
    assert mode == "whole" and "CUDA graphs need a CUDA device (this run is on cpu); using whole" in reason
    for asked, device in (("whole", CPU), ("cudagraphs", CUDA)):
        mode, reason = resolve_decode_compile(asked, make_spec(model=MOE), device)
        assert mode == "none" and "MoE routing has data-dependent shapes" in reason and "decoding eager" in reason
    mode, reason = resolve_decode_compile("whole", spec, CPU, draft=True)
    assert mode == "none" and "speculative decoding" in reason
    mode, reason = resolve_decode_compile("whole", spec, CPU, quantized=True)
    assert mode == "none" and "quantized" in reason


def test_no_cxx_compiler_decodes_eager(make_spec, monkeypatch):
    monkeypatch.setattr("archspec.train.compile.has_cxx", lambda: False)
    mode, reason = resolve_decode_compile("whole", make_spec(), CPU)
    assert mode == "none" and "no C++ compiler" in reason
    assert resolve_decode_compile("whole", make_spec(), CUDA)[0] == "whole"  # no C++ needed on CUDA (Triton)


def test_the_cli_says_why_it_decodes_eager_and_samples_as_without_compile(tmp_path, corpus_dir, capsys):
    """An MoE spec and a speculative pair are refused: eager, the same tokens as without --compile, the reason on
    stderr. A mode that does not exist exits 2 naming --compile."""
    spec = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="moe")
    text = open(spec, encoding="utf-8").read().replace(
        "n_kv_heads: 1}}", "n_kv_heads: 1}, ffn: {kind: moe, n_experts: 4, top_k: 2, expert: {kind: glu, "
                           "hidden_dim: 32}}}")
    open(spec, "w", encoding="utf-8").write(text)
    args = (spec, "--prompt", "ab", "--max-new-tokens", "6", "--temperature", "0")
    rc, eager, err = _sample(capsys, *args)
    assert rc == 0 and "decode compile" not in err and "compiled step" not in err, err
    rc, out, err = _sample(capsys, *args, "--compile", "whole")
    assert rc == 0 and out == eager, err
    assert "decode compile: none (--compile whole refused: MoE routing has data-dependent shapes" in err
    assert "compiled step" not in err

    dense = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="dense")
    rc, _, err = _sample(capsys, dense, "--draft", dense, "--prompt", "ab", "--max-new-tokens", "4",
                         "--temperature", "0", "--compile", "whole")
    assert rc == 0 and "decode compile: none (--compile whole refused: speculative decoding" in err, err
    rc, _, err = _sample(capsys, dense, "--compile", "fastest")
    assert rc == 2 and "--compile" in err and "'fastest'" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_compiled_step_gives_the_eager_greedy_tokens_through_one_graph(make_spec):
    """fp32, greedy: the tokens of eager decode exactly, over 11 compiled steps of one prompt and 9 of a longer one,
    all through one graph (dynamo's unique_graphs counter; a second graph would mean a recompile). The step is built
    as cudagraphs, which the CLI never runs on a CPU (it resolves to whole): so the cudagraphs step's own code (the
    cache's tensors marked static, a step mark per call, the output copied) runs here too; on CPU tensors inductor
    leaves the CUDA graphs out, and the rest is whole's step."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = codegen.generate(make_spec(), write=False).Model().eval()
    step = DecodeStep(model, "cudagraphs")
    graphs = counters["stats"]["unique_graphs"]
    for prompt_len, new in ((5, 12), (9, 10)):
        idx = torch.randint(0, 320, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
        eager = model.generate(idx, new, temperature=0)
        compiled = torch.cat([idx, *stream(model, idx, new, temperature=0, context_length=32, decode=step)], dim=1)
        assert torch.equal(compiled, eager)
    assert step.calls == 11 + 9 and step.compile_s > 0
    assert counters["stats"]["unique_graphs"] - graphs == 1


@pytest.mark.slow
def test_cudagraphs_on_cpu_decodes_whole_past_a_window_as_eager_does(tmp_path, corpus_dir, capsys):
    """A windowed model's ring-buffer caches wrap (window 8) and it runs past context_length 32: the compiled step's
    text is the eager text, and stderr says which mode ran and why."""
    windowed = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="windowed")
    text = open(windowed, encoding="utf-8").read().replace("n_kv_heads: 1}", "n_kv_heads: 1, sparsity: "
                                                           "{kind: sliding_window, window: 8}}")
    open(windowed, "w", encoding="utf-8").write(text)
    args = (windowed, "--prompt", "a" * 20, "--max-new-tokens", "24", "--temperature", "0")
    rc, eager, err = _sample(capsys, *args)
    assert rc == 0, err
    rc, out, err = _sample(capsys, *args, "--compile", "cudagraphs")
    assert rc == 0 and out == eager, err
    assert ("decode compile: whole (--compile cudagraphs refused: CUDA graphs need a CUDA device (this run is on "
            "cpu); using whole)") in err
    assert "24 tokens in" in err and "decoded through a compiled step (whole; its first call" in err
    assert "past context_length 32" in err
