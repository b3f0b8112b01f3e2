"""`python -m ladder`: see ladder/cli.py."""
import sys

from ladder.cli.main import main

sys.exit(main())
