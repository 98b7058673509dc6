"""The built wheel (a non-editable install) is complete: every module, the built-in
scenarios, the validation cases, py.typed, the license; and it runs from outside the
repository with the cases found as package data."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import simulator

pytestmark = pytest.mark.slow  # builds a wheel

ROOT = Path(__file__).resolve().parent.parent
# What the build reads: pyproject.toml names the packages and their data.
BUILD_INPUTS = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "stepsim_errors.py",
    "simulator",
    "topologies",
    "workloads",
    "validation",
)


def _source_files(*parts: str, suffix: str) -> set[str]:
    base = ROOT.joinpath(*parts)
    return {p.relative_to(ROOT).as_posix() for p in base.rglob(f"*{suffix}") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built by pip from a clean copy of the build inputs (no stale build/ dir)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in BUILD_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(p, src / name)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "-w",
            str(tmp / "dist"),
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("stepsim-*.whl")
    return whl


def test_wheel_holds_every_module_the_cases_py_typed_and_the_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the checkout (pyproject.toml lists the packages: a new one must be added there).
    for pkg in ("simulator", "topologies", "workloads"):
        missing = _source_files(pkg, suffix=".py") - names
        assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "stepsim_errors.py" in names  # the top-level module every package's errors derive from
    # The built-in scenarios and every validation case, the latter as simulator/validation_cases/.
    assert not _source_files("simulator", "scenarios", suffix=".yaml") - names
    cases = {
        "simulator/validation_cases/" + f[len("validation/") :] for f in _source_files("validation", suffix=".yaml")
    }
    assert len(cases) >= 28 and not cases - names, sorted(cases - names)
    assert "simulator/validation_cases/korthikanti2022/korthikanti22-175b.yaml" in names
    assert "simulator/py.typed" in names
    dist = f"stepsim-{simulator.__version__}.dist-info"
    assert f"{dist}/licenses/LICENSE" in names
    assert not any(n.startswith(("tests/", "validation/", "notebooks/")) for n in names)
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{dist}/METADATA"))
    assert meta["Version"] == simulator.__version__  # one version: simulator/version.py
    assert meta["License-Expression"] == "Apache-2.0" and meta["License"] is None  # SPDX (PEP 639), no {text=}
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and not any(c.startswith("License ::") for c in classifiers)
    assert "stepsim = simulator.cli:console" in zipfile.ZipFile(wheel).read(f"{dist}/entry_points.txt").decode()


def test_the_installed_layout_runs_from_outside_the_repository(wheel, tmp_path):
    # The wheel unpacked is what `pip install` puts in site-packages; run from a folder
    # that is not the checkout, so that only the unpacked copy can be imported.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg"}

    # One interpreter (each start costs seconds): where the suite is, what the glob finds,
    # `stepsim --version`, one packaged case simulated end to end (0.1 s of simulation; the
    # 1T case alone takes minutes), and `stepsim run quickstart`.
    script = """if True:
        import sys
        import simulator.cli.app as cli, simulator.studies.validate as v
        print(v.SUITE_DIR)
        print(*[c.name for c in v.discover(['korthikanti2022/*'])])
        cli.main(['--version'])
        sys.exit(cli.main(['validate', '--cases', 'korthikanti2022/korthikanti22-22b*', '--jobs', '1', '--quiet'])
                 or cli.main(['run', 'quickstart', '--json']))
    """
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    suite_dir, names, version, *rest = r.stdout.splitlines()
    assert Path(suite_dir) == site / "simulator" / "validation_cases"
    assert names == "korthikanti22-175b korthikanti22-1t korthikanti22-22b korthikanti22-530b"
    assert version == f"stepsim {simulator.__version__}"
    rest = "\n".join(rest)
    assert "korthikanti22-22b" in rest and "1 cases; median |error|" in rest
    assert '"name": "quickstart-llama3-8b-16xh100"' in rest and f'"stepsim_version": "{simulator.__version__}"' in rest
