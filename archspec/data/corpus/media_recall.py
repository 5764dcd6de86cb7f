"""media_recall: key/value pairs that only the media holds, questions in the text (issue 46's capability task).

Each example has one media item of `pairs` tokens; token j encodes a pair, key_code[k_j] + value_code[v_j] (+ a
little noise), with fixed random codebooks (drawn from `seed`), in a random order. The text is the marker, then each
key of the item (in another random order) followed by its value:

    <media> k3 v3 k1 v1 k4 v4 k2 v2

The answers are the values, predicted at their key's position. Keys are distinct within an item, values drawn with
replacement: nothing in the text tells a value, so a text-only model scores chance, 1 / values; a model that reads
the media can look the key up. Examples are generated in memory from a torch.Generator: no file, no download.

Not a registered corpus kind: the shared training loop (archspec.train) does not pass media to the model yet, so a
run could not learn it; `train_media_recall` below is the small loop the measurement (bench/media_recall.py) and the
test use, and `probe` scores a model on fresh examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FIRST_SYMBOL = 4  # ids below are kept free (archspec.data.base: PAD, KEY_MARK, QUESTION)


@dataclass(frozen=True)
class MediaRecall:
    pairs: int = 4  # key/value pairs per item: the item's media tokens
    keys: int = 16  # key symbols
    values: int = 16  # value symbols (chance: 1 / values)
    width: int = 32  # the media features' width
    noise: float = 0.1
    seed: int = 0  # draws the codebooks (the "encoder"), not the examples

    @property
    def seq_len(self) -> int:
        return 1 + 2 * self.pairs

    @property
    def chance(self) -> float:
        return 1.0 / self.values

    def vocab_needed(self) -> int:
        return FIRST_SYMBOL + self.keys + self.values

    def codebooks(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randn(self.keys, self.width, generator=g), torch.randn(self.values, self.width, generator=g)

    def batch(self, g: torch.Generator, size: int, marker_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(idx (size, 1 + 2·pairs), targets (same; -100 except the answers), media (size, 1, pairs, width))."""
        key_code, value_code = self.codebooks()
        keys = torch.argsort(torch.rand(size, self.keys, generator=g), dim=1)[:, : self.pairs]  # distinct per item
        values = torch.randint(0, self.values, (size, self.pairs), generator=g)
        in_media = torch.argsort(torch.rand(size, self.pairs, generator=g), dim=1)  # the media's order of the pairs
        asked = torch.argsort(torch.rand(size, self.pairs, generator=g), dim=1)  # the text's order
        media = key_code[keys.gather(1, in_media)] + value_code[values.gather(1, in_media)]  # (size, pairs, width)
        media = media + self.noise * torch.randn(media.shape, generator=g)
        idx = torch.full((size, self.seq_len), marker_id, dtype=torch.long)  # the marker, then the pairs
        idx[:, 1::2] = FIRST_SYMBOL + keys.gather(1, asked)
        idx[:, 2::2] = FIRST_SYMBOL + self.keys + values.gather(1, asked)
        targets = torch.full_like(idx, -100)
        targets[:, 1::2] = idx[:, 2::2]  # at each key: its value
        return idx, targets, media[:, None]


@torch.no_grad()
def probe(model: torch.nn.Module, task: MediaRecall, marker_id: int, examples: int = 512, seed: int = 12345,
          media: bool = True) -> float:
    """Accuracy on the answers of `examples` fresh examples (argmax), with or without giving the model the media."""
    was = model.training
    model.eval()
    idx, targets, feats = task.batch(torch.Generator().manual_seed(seed), examples, marker_id)
    logits = model(idx, media=feats) if media else model(idx)
    model.train(was)
    answer = targets >= 0
    return float((logits.argmax(-1)[answer] == targets[answer]).float().mean())


def train_media_recall(model: torch.nn.Module, task: MediaRecall, marker_id: int, steps: int, batch: int = 32,
                       lr: float = 3e-3, seed: int = 0, media: bool = True, every: int = 0
                       ) -> list[tuple[int, float]]:
    """AdamW on fresh examples for `steps` steps; the probe's accuracy every `every` steps (and at the end)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curve = []
    model.train()
    for step in range(1, steps + 1):
        idx, targets, feats = task.batch(g, batch, marker_id)
        _, loss = model(idx, targets, media=feats) if media else model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (every and step % every == 0) or step == steps:
            curve.append((step, probe(model, task, marker_id, media=media)))
    return curve
