"""A built wheel carries what an installed package needs: every wing's modules, the contracts and
the console script."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_contracts_and_entry_point(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    (whl,) = tmp_path.glob("qmind_render-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        for c in ("channel_spec.yaml", "theme_schema.yaml"):
            member = f"qmind_render/contracts/{c}"
            assert member in names, f"{member} missing from the wheel"
            assert z.read(member) == (ROOT / "contracts" / c).read_bytes()
        # every module the checkout has, the wings' sub-packages included
        modules = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "qmind_render").rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert any("/core/" in m for m in modules) and "qmind_render/core/__init__.py" in modules
        assert modules <= names, f"missing from the wheel: {sorted(modules - names)[:5]}"
        entry = next(n for n in names if n.endswith("entry_points.txt"))
        assert "qmind = qmind_render.cli:main" in z.read(entry).decode()
