"""DeepSeek-V4.1 attention (`--model attn_v41`): its fixture and both sides driven over it
(sides.py), the first divergence with local vs propagated error re-run from the reference's
state (locate.py), run/locate/report for it (cli.py), and compare/dump of its archives
(archive.py).

May import: ladder/engine/, ladder/model/, ladder/sides/ (model_input's errors), bounded/,
reference/v41/ and port/v41/. A second model's ladder would sit beside this one as its own
package.
"""
