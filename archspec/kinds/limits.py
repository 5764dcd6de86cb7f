"""Hard bounds: large enough for any real model (accounting works on a 1T-parameter spec), small enough that a typo
such as an extra zero gives a clear message instead of an allocation failure deep inside torch."""

MAX_VOCAB = 1 << 20
MAX_CONTEXT = 1 << 20
MAX_WIDTH = 1 << 16  # d_model
MAX_HIDDEN = 1 << 20  # FFN hidden size
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
