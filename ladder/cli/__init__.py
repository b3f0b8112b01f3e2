"""`python -m ladder`: the parser (parser.py), the commands run/locate/report/regen/rules
(commands.py), shrink (shrink.py), compare/dump/regen --format needle-rs (compare.py), points (points.py), the
argument checks made before any work (args.py), the table printed (show.py), the exceptions
that mean exit 2 (errors.py), the progress bar (progress.py), and main.py, which dispatches.

May import: everything below it (sides/, formats/, engine/, model/, v41/). main.py sits above
ladder/sweep/ (it dispatches `sweep`), as does shrink.py (--from-sweep reads a case's row);
sweep/ uses the other modules, below both. A new
command goes in its own module here, added to parser.py and main.py.
"""
