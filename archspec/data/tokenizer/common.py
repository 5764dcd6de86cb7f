"""What every tokenizer kind shares: the EOS text, the format of identities, and the transformers files that go with
a tokenizer.json when a run is exported (`archspec export-hf`)."""

from __future__ import annotations

import json

EOS_TEXT = "<|endoftext|>"
FORMAT = 1  # bump when the meaning of ids for the same request changes (invalidates every cache entry)


def hf_files(tokenizer_json: str, model_max_length: int | None = None) -> dict[str, str]:
    """A transformers tokenizer directory's files for an HF `tokenizers` JSON whose EOS is EOS_TEXT: what
    `AutoTokenizer.from_pretrained` reads. Text that spells EOS_TEXT stays text, as archspec encodes it
    (`split_special_tokens`); decoding keeps spaces as they are (no clean-up), so decode(encode(text)) is the text.
    No BOS, no padding token, no post-processor: a prompt's ids are exactly archspec's."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TEXT,
        "bos_token": None,
        "unk_token": None,
        "pad_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length if model_max_length is not None else 1 << 30,
    }
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps({"eos_token": EOS_TEXT}, indent=2) + "\n",
    }
