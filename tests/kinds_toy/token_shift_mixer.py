"""A toy token mixer registered from outside archspec, through the public API only (tests/test_mixers.py).

Token shift (RWKV's, alone): y = out(mix · x_t + (1 − mix) · x_{t−1}), one learned mix per channel. Its decoding state
is the previous position's input: archspec.runtime's ConvCache with a kernel of 2."""

from __future__ import annotations

from typing import ClassVar, Literal

from archspec.kinds import MixerKind, register


@register
class TokenShiftSpec(MixerKind):
    kind: Literal["token_shift"] = "token_shift"
    attribute: ClassVar[str] = "shift"
    component: ClassVar[str] = "shift"
    base_class: ClassVar[str] = "TokenShift"
    section: ClassVar[str] = "token shift"

    def mixer_params(self, m) -> int:
        return m.d_model * m.d_model + m.d_model  # out, mix

    def mixer_flops(self, m, seq_len, full_attention=False):
        return {"shift": 2 * m.d_model * m.d_model}

    def state_bytes_per_token(self, m, element_bytes):
        return 0

    def state_bytes_per_sequence(self, m, seq_len, element_bytes):
        return m.d_model * element_bytes

    def saved_bytes(self, m, seq_len, mm, device):
        return 3 * m.d_model * mm

    @property
    def cache_class(self) -> str:
        return "ConvCache"

    def max_lookback(self):
        return 2

    def describe(self, m) -> str:
        return "token shift"
