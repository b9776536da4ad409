"""Draw the picture the README and the docs' home page open with, from the model that ships with the
package: `serve.showcase` (frames of unseen episodes in its held-out cells: the channels, the ground
truth, and the model at 1, 2 and 4 DDIM steps), written to nbs/images/shipped.png.

    python tools/readme_picture.py    # after `qmind ship runs/shipped`
"""

from __future__ import annotations

from pathlib import Path

from qmind_render.serve.renderer import load_served, showcase
from qmind_render.util import save_figure

OUT = Path(__file__).resolve().parents[1] / "nbs" / "images" / "shipped.png"


def main() -> int:
    served = load_served()
    save_figure(showcase(served), OUT, dpi=110, metadata={"Software": None})
    print(f"{OUT.relative_to(OUT.parents[2])}: {served.name} (step {served.step})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
