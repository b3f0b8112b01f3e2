"""`python -m ladder`: see ladder/cli/main.py."""
import sys

from ladder.cli.main import main

sys.exit(main())
