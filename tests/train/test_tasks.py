"""Capability tasks as corpora (archspec.train.tasks): deterministic per seed, answers where claimed, accuracy on the
answer positions only; a model that copies the right token scores 1.0 and a constant model scores chance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archspec.errors import UserError
from archspec.ablate.probe import evaluate
from archspec.spec import load_spec_dict
from archspec.spec.train import MQARCorpus, PasskeyCorpus
from archspec.train.tasks import (FIRST_SYMBOL, IGNORE, KEY_MARK, QUESTION, Scorer, TaskData, check_task, generate,
                                  task_problems)

VOCAB_IDS = 320


def mqar(**kw) -> MQARCorpus:
    return MQARCorpus(**{"vocab": 16, "pairs": 4, "train_examples": 200, "val_examples": 400, **kw})


def passkey(**kw) -> PasskeyCorpus:
    return PasskeyCorpus(**{"vocab": 8, "distances": [3, 10, 20], "filler": 16, "train_examples": 200,
                            "val_examples": 600, **kw})


def test_examples_are_deterministic_per_seed_and_differ_across_seeds_and_splits():
    for corpus in (mqar(), passkey()):
        a, b = generate(corpus, 32, "train"), generate(corpus, 32, "train")
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.answers, b.answers)
        other = generate(corpus.model_copy(update={"seed": 1}), 32, "train")
        assert not np.array_equal(a.tokens, other.tokens)
        assert not np.array_equal(a.tokens[:200], generate(corpus, 32, "val").tokens[:200])
        assert a.tokens.shape == (200, 33) and a.tokens.max() < 256


def test_mqar_answers_are_the_values_of_the_queried_keys():
    corpus = mqar(queries=3)
    ex = generate(corpus, 24, "val")
    x, y = ex.batch(np.arange(len(ex)))
    assert ((y != IGNORE).sum(1) == 3).all()  # one answer per query, nothing else scored
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0:8:2], row_x[1:8:2]
        assert len(set(keys)) == 4 and all(FIRST_SYMBOL <= k < FIRST_SYMBOL + 8 for k in keys)
        assert all(FIRST_SYMBOL + 8 <= v < FIRST_SYMBOL + 16 for v in values)
        answers = [(t, v) for t, v in enumerate(row_y) if v != IGNORE]
        assert [t for t, _ in answers] == [8, 10, 12]
        for t, v in answers:
            assert row_x[t] in keys and v == values[keys.index(row_x[t])]
            assert row_x[t + 1] == v  # the value follows its query in the sequence


def test_passkey_answers_follow_the_question_at_the_claimed_distance():
    corpus = passkey(key_len=2)
    ex = generate(corpus, 32, "val")
    x, y = ex.batch(np.arange(len(ex)))
    assert set(ex.buckets.tolist()) == {3, 10, 20}
    for row_x, row_y, d in zip(x.tolist(), y.tolist(), ex.buckets.tolist()):
        question = 32 - 2
        answers = [t for t, v in enumerate(row_y) if v != IGNORE]
        assert answers == [question, question + 1] and row_x[question] == QUESTION
        start = question - d
        assert row_x[start - 1] == KEY_MARK and row_x.count(KEY_MARK) == 1
        assert [row_y[question], row_y[question + 1]] == row_x[start:start + 2]
        key_symbols = range(FIRST_SYMBOL, FIRST_SYMBOL + 8)
        assert all(tok not in key_symbols for i, tok in enumerate(row_x) if not (start <= i < start + 2
                                                                                 or i > question))


class CopyRecall(torch.nn.Module):
    """Attention by hand: at each position, find the same token earlier and predict what followed it (MQAR); at the
    question, predict the tokens after the passkey marker (passkey). Wrong (a fixed id) everywhere else."""

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, VOCAB_IDS)
        logits[..., 0] = 1.0
        for b in range(B):
            row = idx[b].tolist()
            for t in range(T):
                if QUESTION in row[:t + 1]:  # the question or a passkey token after it: copy the next passkey token
                    target = row[row.index(KEY_MARK) + 1 + t - row.index(QUESTION)]
                else:
                    earlier = [j for j in range(t - 1) if row[j] == row[t] and j % 2 == 0]
                    if not earlier:
                        continue
                    target = row[earlier[0] + 1]
                logits[b, t, target] = 10.0
        return logits


class Constant(torch.nn.Module):
    def __init__(self, token: int):
        super().__init__()
        self.token = token

    def forward(self, idx):
        logits = torch.zeros(*idx.shape, VOCAB_IDS)
        logits[..., self.token] = 1.0
        return logits


def test_a_copying_model_scores_one_and_a_constant_model_scores_chance():
    corpus = mqar(vocab=16, pairs=4, val_examples=3000)
    assert evaluate(CopyRecall(), corpus, 16, 200, 50, torch.device("cpu"))["accuracy"] == 1.0
    const = evaluate(Constant(FIRST_SYMBOL + 8), corpus, 16, None, 500, torch.device("cpu"))
    assert const["chance"] == 2 / 16 and abs(const["accuracy"] - 2 / 16) < 0.02  # 12,000 answers: SE ≈ 0.003
    pk = passkey(key_len=2, val_examples=2000)
    result = evaluate(CopyRecall(), pk, 32, 120, 40, torch.device("cpu"))
    assert result["accuracy"] == 1.0 and {result[f"accuracy.d{d}"] for d in (3, 10, 20)} == {1.0}
    const = evaluate(Constant(FIRST_SYMBOL), pk, 32, None, 500, torch.device("cpu"))
    assert abs(const["accuracy"] - 1 / 8) < 0.02 and const["chance"] == 1 / 8


def test_accuracy_counts_the_answer_positions_only():
    targets = torch.full((2, 5), IGNORE)
    targets[0, 3], targets[1, 1] = 7, 9
    right_on_answers = torch.full((2, 5, 12), 0.0)
    right_on_answers[0, 3, 7] = right_on_answers[1, 1, 9] = 1.0  # argmax 0 elsewhere: wrong on every other position
    s = Scorer()
    s.add(right_on_answers, targets)
    assert (s.correct, s.total) == (2, 2) and s.metrics()["probe.accuracy"] == 1.0
    everything_but_answers = torch.zeros(2, 5, 12)
    everything_but_answers[..., 5] = 1.0
    s = Scorer()
    s.add(everything_but_answers, targets)
    assert s.metrics()["probe.accuracy"] == 0.0
    s = Scorer(by_bucket={4: [0, 0], 9: [0, 0]})
    s.add(right_on_answers, targets, torch.tensor([4, 9]))
    right_on_answers[1, 1, 9] = 0.0
    s.add(right_on_answers, targets, torch.tensor([4, 9]))
    assert s.metrics(prefix="") == {"accuracy": 0.75, "accuracy.d4": 1.0, "accuracy.d9": 0.5}


@pytest.mark.parametrize("corpus, seq_len, message", [
    (passkey(distances=[3, 40]), 32, "distances.1: impossible distance 40: with train.seq_len = 32 and key_len 1 "
                                     "the longest distance is 30"),
    (passkey(key_len=4, distances=[2]), 32, "distances.0: impossible distance 2: a passkey of 4 tokens"),
    (passkey(vocab=200, filler=100), 32, "filler: vocab + filler must be at most 252"),
    (mqar(pairs=10), 64, "pairs: must be at most vocab // 2 (8"),
    (mqar(pairs=8, queries=9), 64, "queries: must be at most pairs (8"),
    (mqar(vocab=64, pairs=16), 40, "16 pairs and 16 queries take 64 tokens, more than a window of train.seq_len + 1"),
])
def test_impossible_tasks_are_refused_with_the_reason(corpus, seq_len, message):
    problems = [f"{'.'.join(map(str, path))}: {m}" for path, m, _ in task_problems(corpus, seq_len)]
    assert any(message in p for p in problems), problems
    with pytest.raises(UserError):
        check_task(corpus, seq_len)


def spec_dict(corpus: dict, **train) -> dict:
    return {"name": "task-tiny",
            "model": {"vocab_size": VOCAB_IDS, "context_length": 32, "d_model": 32, "n_layers": 1,
                      "attention": {"n_heads": 2}, "ffn": {"kind": "mlp", "hidden_dim": 64}},
            "train": {"steps": 4, "batch_size": 8, "seq_len": 32, "compile": "none", "warmup_steps": 0,
                      "eval_interval": 2, "data": {"corpus": corpus}, **train}}


def test_spec_rules_refuse_a_task_that_does_not_fit_or_a_bpe_tokenizer():
    with pytest.raises(UserError) as e:
        load_spec_dict(spec_dict({"kind": "passkey", "distances": [8, 31]}))
    assert "train.data.corpus.distances.1" in e.value.render() and "impossible distance 31" in e.value.render()
    with pytest.raises(UserError) as e:
        load_spec_dict(spec_dict({"kind": "mqar"}, data={"corpus": {"kind": "mqar"}, "tokenizer": {"kind": "bpe"}}))
    assert "train.data.tokenizer.kind" in e.value.render() and "byte" in e.value.render()


def test_task_data_batches_whole_examples_in_a_seeded_order_and_resumes():
    spec = load_spec_dict(spec_dict({"kind": "mqar", "vocab": 16, "pairs": 4, "train_examples": 20,
                                     "val_examples": 12}))
    c = spec.train.data.corpus
    data = TaskData(c, 32, 8, seed=0)
    again = TaskData(c, 32, 8, seed=0)
    other = TaskData(c, 32, 8, seed=1)
    assert data.data_hash == other.data_hash  # the examples are the data; the training seed orders them
    batches = [data.sampler.next_batch() for _ in range(3)]  # 24 of 20 examples: crosses an epoch
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, [again.sampler.next_batch() for _ in range(3)]))
    assert not torch.equal(batches[0][0], other.sampler.next_batch()[0])
    resumed = TaskData(c, 32, 8, seed=0)
    state = data.sampler.state_dict()
    resumed.sampler.load_state_dict(state)
    assert torch.equal(data.sampler.next_batch()[0], resumed.sampler.next_batch()[0])
    assert [len(b[0]) for b in data.val_batches] == [8, 4] and data.describe()["split"] == "examples"


def test_train_refuses_an_impossible_distance_with_exit_2(tmp_path, capsys):
    from archspec.cli import main

    spec = tmp_path / "pk.yaml"
    spec.write_text("name: pk\nmodel: {vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, "
                    "attention: {n_heads: 2}}\ntrain: {seq_len: 32, data: {corpus: {kind: passkey}}}\n")
    rc = main(["train", str(spec), "--set", "train.data.corpus.distances=[8, 500]", "--device", "cpu",
               "--registry", f"sqlite:///{tmp_path}/r.db"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.data.corpus.distances.1: impossible distance 500" in err and "Traceback" not in err
    assert not (tmp_path / "r.db").exists()
