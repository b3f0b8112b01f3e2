"""The sweep's HTML report renders each case's details as HTML tables.
"""


def test_the_sweep_html_report_renders_its_details_as_html_tables():
    from ladder.sweep.report import html, markdown_html
    md = ("## Worst points across the grid\n\n| case | status |\n|---|---|\n| c0 | fail \\| x |\n"
          "\n## Errors\n\n- c1: boom <b>\n")
    got = markdown_html(md)
    assert got == ("<h3>Worst points across the grid</h3>\n<table><tr><th>case</th><th>status"
                   "</th></tr><tr><td>c0</td><td>fail | x</td></tr></table>\n<h3>Errors</h3>\n"
                   "<ul><li>c1: boom &lt;b&gt;</li></ul>")
    page = html({"name": "t", "grid_file": "g.toml", "grid_sha256": "0" * 64, "shard": "1/1",
                 "cases": 0}, [], [])
    assert "<pre" not in page and "<h3>Worst points across the grid</h3>\n<table>" in page
