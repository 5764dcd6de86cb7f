"""`python -m archspec.cli`: the same as `python -m archspec` and the `archspec` command (kept: older docs and
torchrun lines spell it so). Running a package's __main__ imports the package first, so the CLI is loaded already."""

import sys

from archspec.cli import main

if __name__ == "__main__":
    sys.exit(main())
