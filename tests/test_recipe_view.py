"""One owner for the recipe's derived quantities (archspec.recipe.RecipeView): the run about to train, the row the
registry keeps of it, the sweep's budgets and the memory plan read the same figures, and no other module multiplies
them out again."""

from __future__ import annotations

import math
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.ablate.sweep import Budget, steps_for_budget
from archspec.spec import load_spec_dict
from archspec.recipe import RecipeView
from archspec.train.build import run_recipe
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def _spec(**train):
    return load_spec_dict({"name": "tiny", "model": tiny_model(), "train": {"steps": 100, "warmup_steps": 0, **train}})


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 8), accum=st.integers(1, 4), seq=st.integers(1, 8).map(lambda n: 2 * n),
       world=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2]))
def test_a_run_and_its_stored_recipe_agree_on_tokens_per_step_and_global_batch(batch, accum, seq, world, tp):
    if world % tp:
        tp = 1
    spec = _spec(batch_size=batch, grad_accum=accum, seq_len=seq, parallel={"kind": "ddp", "tp": tp})
    dp = world // tp
    live = RecipeView.of(spec.train, data_parallel=dp)
    stored = RecipeView.stored(run_recipe(spec, world_size=world))
    assert stored is not None
    assert live.tokens_per_step == stored.tokens_per_step == batch * accum * seq * dp
    assert live.global_batch == stored.global_batch == batch * accum * dp
    # processes that split the model (tp) share their replica's tokens: one replica's figure, not the world's
    assert live.tokens_per_replica_step * dp == live.tokens_per_step


def test_a_damaged_stored_recipe_has_no_view():
    assert RecipeView.stored({"batch_size": 8, "seq_len": 16}) is None
    assert RecipeView.stored({"batch_size": "x", "grad_accum": 1, "seq_len": 16}) is None


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 10**7), batch=st.integers(1, 8), accum=st.integers(1, 4))
def test_a_token_budget_buys_the_steps_the_view_counts(tokens, batch, accum):
    spec = _spec(batch_size=batch, grad_accum=accum, seq_len=16)
    budget = Budget(tokens=tokens)
    assert steps_for_budget(spec, budget) == max(1, math.ceil(tokens / RecipeView.of(spec.train).tokens_per_step))


@given(precision=st.sampled_from(["auto", "fp32", "bf16", "fp16", "fp8"]), device=st.sampled_from(["cpu", "cuda"]))
def test_the_memory_plan_counts_matmuls_at_the_views_element_size(precision, device):
    from archspec.memory import setup_from_spec

    spec = _spec(precision=precision)
    assert setup_from_spec(spec, device=device).bf16 == (RecipeView.of(spec.train).matmul_bytes(device) == 2)


# batch_size × grad_accum (× seq_len): the product the view owns, written out anywhere else
_PRODUCT = re.compile(r"batch_size\s*\*\s*[\w.]*grad_accum|grad_accum\s*\*\s*[\w.]*batch_size")


def test_no_module_but_the_view_multiplies_out_tokens_per_step():
    offenders = []
    for path in sorted((ROOT / "archspec").rglob("*.py")):
        if path == ROOT / "archspec" / "recipe.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _PRODUCT.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "tokens per step is RecipeView's (archspec/recipe.py):\n" + "\n".join(offenders)
