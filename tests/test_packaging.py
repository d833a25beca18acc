"""The wheel installs one import name: replay/, profiling/ and ui/ become rltrace.* subpackages."""

from __future__ import annotations

import shutil
import subprocess
import zipfile

from .conftest import PYTHON, REPO


def test_wheel_has_only_the_rltrace_import_name(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("rltrace", "replay", "profiling", "ui"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [PYTHON, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("rltrace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"rltrace", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for pkg in ("rltrace/replay/__init__.py", "rltrace/profiling/__init__.py", "rltrace/ui/__init__.py", "rltrace/store/views.py"):
        assert pkg in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rltrace = rltrace.cli:main" in entry_points
