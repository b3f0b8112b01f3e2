"""The comparison engine; it knows no model. A ladder (trace.py: `Ladder`, its steps in
steps.py) and its file (archive.py), per-point metrics (metrics.py) and verdicts
(compare.py: `compare_ladders`, `Comparison`), tolerance rules as data (rule.py the types,
rule_tables.py the tables, rules.py files and the public surface), tables (table.py), the
first divergence and the local/inherited verdict logic (locate.py), a stored reference held to
a recomputed one (stand_in.py), reports and the error-growth plot (report.py, plot.py), and
writing files atomically (atomic.py, safe_print.py).

May import: bounded/ and ladder/model/ only; never reference/, port/ or kernels/, not even
inside a function (tests/project/test_imports.py). Any runner's outputs, saved or live, go
through it as `Ladder`s.
"""
