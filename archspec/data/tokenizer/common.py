"""What every tokenizer kind shares: the EOS text and the format of identities."""

EOS_TEXT = "<|endoftext|>"
FORMAT = 1  # bump when the meaning of ids for the same request changes (invalidates every cache entry)
