"""Hypothesis strategies over spec space, invalid-spec mutations, and the checks that tests of generated modules share.

Needs the test extra (`pip install -e '.[test]'`): hypothesis is a test dependency, not a runtime one, and no
production module imports this package.

    from archspec import testing as T

    @given(T.valid_specs())
    def test_builds(spec): ...

By role:

- `archspec.testing.strategies`: valid spec dicts and specs (`valid_specs`, `spec_dicts`, one strategy per union
  family with its table of kinds: `norms`/`NORM_KINDS`, ...). A new union member is drawn as soon as it is
  registered (a kind) or listed in its table (a corpus or tokenizer); `tests/test_properties.py` fails until the
  tables list every member the JSON Schema accepts.
- `archspec.testing.mutations`: invalid specs and where each problem must be reported (`invalid_spec_cases`,
  `invalid_spec_dicts`, `MUTATIONS`); a kind's own rules come from its unit (`KindUnit.invalid_cases`).
- `archspec.testing.assertions`: `assert_causal`, `module_active_params`.
- `archspec.testing.introspect`: spec dicts read through the pydantic models (`union_members`, `field_at`,
  `leaves`). What a field declares (`field_values`, `fields_of`) is `archspec.kinds.introspect`: the kinds' own
  strategies use it.
"""

from __future__ import annotations

from archspec.kinds.introspect import field_values, fields_of
from archspec.testing.assertions import assert_causal, module_active_params
from archspec.testing.introspect import field_at, leaves, union_members
from archspec.testing.mutations import MUTATIONS, invalid_spec_cases, invalid_spec_dicts
from archspec.testing.strategies import (ATTENTION_KINDS, CORPUS_KINDS, FFN_KINDS, MIXER_KINDS, NORM_KINDS, POSITIONAL_KINDS,
                                         SPARSITY_KINDS, mixer_patterns, mixers,
                                         TOKENIZER_KINDS, attentions, block_shapes, corpora, divisors, ffns, layer_groups,
                                         model_dicts, names, norms, positionals, selections, shuffled, sparsities,
                                         spec_dicts, tokenizers, train_dicts, valid_specs)

__all__ = [
    "field_values", "fields_of", "names", "norms", "positionals", "sparsities", "ffns", "attentions", "model_dicts",
    "block_shapes", "corpora", "tokenizers", "train_dicts", "spec_dicts", "valid_specs", "invalid_spec_cases", "invalid_spec_dicts",
    "MUTATIONS", "selections", "layer_groups", "NORM_KINDS", "POSITIONAL_KINDS", "SPARSITY_KINDS", "FFN_KINDS",
    "CORPUS_KINDS", "TOKENIZER_KINDS", "ATTENTION_KINDS", "union_members", "field_at", "leaves", "shuffled", "divisors",
    "assert_causal", "module_active_params", "MIXER_KINDS", "mixers", "mixer_patterns",
]
