"""archspec: declarative decoder-only transformer specs → generated PyTorch modules → runs in a registry."""

__version__ = "0.1.0"
