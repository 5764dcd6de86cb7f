"""`python -m archspec`: the same as the `archspec` command."""

from archspec.entry import entry

if __name__ == "__main__":
    entry()
