"""`python -m archspec.cli`: the same as `python -m archspec` and the `archspec` command (kept: older docs and
torchrun lines spell it so)."""

from archspec.entry import entry

if __name__ == "__main__":
    entry()
