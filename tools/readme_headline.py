"""Write the README's headline table from the committed main job and shipped model
(`sweeps.sweep_report.result_table` on its `headline_runs`), between its
`<!-- headline ... -->` markers; tests/test_results.py checks the README holds exactly this.

    python tools/readme_headline.py
"""

from __future__ import annotations

import re
from pathlib import Path

from qmind_render.sweeps.sweep_report import headline_runs, result_table
from qmind_render.util import atomic_write

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = headline_runs(ROOT / "results")
MARKERS = re.compile(r"(<!-- headline: [^>]*-->\n)(.*?)(<!-- /headline -->)", re.S)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if not MARKERS.search(text):
        raise SystemExit(f"{readme}: no <!-- headline: ... --> ... <!-- /headline --> markers")
    new = MARKERS.sub(lambda m: m.group(1) + result_table(HEADLINE) + "\n" + m.group(3), text)
    atomic_write(readme, new)
    print(f"{readme}: headline table {'rewritten' if new != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
