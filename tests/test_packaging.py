"""The wheel installs one import name: replay/, profiling/ and ui/ become rltrace.* subpackages;
the sdist and the wheel carry the license text."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import zipfile

import pytest

import rltrace

from .conftest import PYTHON, REPO


def build_wheel(tmp_path, kind: str = "wheel"):
    """The wheel (or sdist), built from a copy of the sources (building in the checkout would leave build/ there)."""
    src = tmp_path / "src"
    if not src.exists():
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(REPO / name, src / name)
        for folder in ("rltrace", "replay", "profiling", "ui"):
            shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [PYTHON, "-m", "build", f"--{kind}", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp_path / "dist").glob("rltrace-*.whl" if kind == "wheel" else "rltrace-*.tar.gz")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built once for the tests of this module (each reads it, none changes it)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_license_text_ships_in_the_sdist_and_the_wheel(wheel, tmp_path):
    """pyproject says Apache-2.0: the license's own text is at the top of the repository and in both
    distributions (the license asks that it go with every copy)."""
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    whl = zipfile.ZipFile(wheel)
    (licensed,) = [n for n in whl.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert whl.read(licensed).decode() == text
    metadata = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "\nLicense-Expression: Apache-2.0\n" in metadata and "\nLicense-File: LICENSE\n" in metadata
    with tarfile.open(build_wheel(tmp_path, "sdist")) as sdist:
        (member,) = [m for m in sdist.getmembers() if m.name == f"rltrace-{rltrace.__version__}/LICENSE"]
        assert sdist.extractfile(member).read().decode() == text


def test_wheel_has_only_the_rltrace_import_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"rltrace", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for pkg in ("rltrace/replay/__init__.py", "rltrace/profiling/__init__.py", "rltrace/ui/__init__.py", "rltrace/store/views.py",
                "rltrace/integrations/bootstrap/sitecustomize.py", "rltrace/collect/receiver.py",
                "rltrace/integrations/trl.py", "rltrace/integrations/trl_replay.py"):
        assert pkg in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rltrace = rltrace.cli:console" in entry_points
    assert "trl = rltrace.integrations.trl:TRLInstrumentor" in entry_points
    # the version is written once, in rltrace/__init__.py; the wheel's metadata reads it from there
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"\nVersion: {rltrace.__version__}\n" in metadata
    assert wheel.name.startswith(f"rltrace-{rltrace.__version__}-")
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and '\nversion = "' not in pyproject


def test_a_folder_named_rltrace_beside_a_script_does_not_shadow_the_install(tmp_path):
    """A clone (or any folder) called rltrace/ next to a user's script is not imported instead."""
    (tmp_path / "rltrace").mkdir()
    (tmp_path / "train.py").write_text("import rltrace\nprint(rltrace.init.__module__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([PYTHON, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rltrace.api"


@pytest.mark.slow
def test_the_wheel_without_extras_runs_the_command_on_a_recorded_run(wheel, tmp_path):
    """`pip install rltrace` (no extras) gives a working `rltrace --version`, `info` and `report`."""
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "streamlit" not in listed and "torch" not in listed  # really no extras

    run = tmp_path / "run"
    from rltrace.testing import RunBuilder

    b = RunBuilder(run)
    trainer = b.process("trainer")
    for step in range(3):
        trainer.span("rollout", step, step + 0.2, step=step)
        trainer.span("train", step + 0.2, step + 0.3, step=step)
    b.write()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    exe = str(venv / "bin" / "rltrace")
    for args in (["--version"], ["info", str(run)], ["report", str(run)]):
        out = subprocess.run([exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        assert out.stdout.strip()
