"""``python -m rhumbatron.cli``: the ``rhumbatron`` command."""

import sys

from rhumbatron.cli import main

if __name__ == "__main__":
    sys.exit(main())
