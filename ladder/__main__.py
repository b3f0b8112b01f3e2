"""`python -m ladder`: see ladder/cli.py."""
import sys

from .cli import main

sys.exit(main())
