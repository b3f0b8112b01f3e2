"""`python -m ladder sweep`: a TOML grid of `run` flags (grid.py), each case run in-process and
turned into its JSON row (row.py), cases pooled across processes, sharded and resumed
(command.py), and shards merged into one report with a heat map (report.py).

May import: ladder/cli/ below main.py (the run pipeline and its checks), sides/, engine/,
model/ and bounded/. Only ladder/cli/main.py imports it.
"""
