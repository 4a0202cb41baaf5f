"""The wheel carries the prebuilt labextension and the server config, and needs no Node.

Builds the wheel from this checkout (the labextension must already be built, as the
README's install does), installs it into a fresh virtualenv with Node removed from
PATH, and asks Jupyter what is enabled there.

The nested virtualenv takes Jupyter from the environment running the tests, not from
the base interpreter (which, under a virtualenv, has no Jupyter): a ``.pth`` file adds
the outer site-packages after its own, so the freshly installed wheel is found first.
The Jupyter commands run as modules of the nested interpreter, because ``jupyter
<subcommand>`` would find the outer environment's ``jupyter-<subcommand>`` script on
PATH and report on the outer prefix instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "jupyter_gpumem" / "labextension" / "static" / "style.js"

pytestmark = pytest.mark.skipif(
    not BUILT.exists(), reason="labextension not built: pip install -e . first"
)


def _without_node(env: dict[str, str]) -> dict[str, str]:
    parts = [
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if not (Path(p) / "node").exists() and not (Path(p) / "npm").exists()
    ]
    return {**env, "PATH": os.pathsep.join(parts)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    env = _without_node(dict(os.environ))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, env=env,
    )  # fmt: skip
    (whl,) = out.glob("jupyter_gpumem-*.whl")
    return whl


def test_wheel_ships_the_prebuilt_extension_and_server_config(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = "jupyter_gpumem-0.1.0.data/data/"
    assert f"{data}share/jupyter/labextensions/jupyter-gpumem/package.json" in names
    assert f"{data}share/jupyter/labextensions/jupyter-gpumem/install.json" in names
    assert any(
        n.startswith(f"{data}share/jupyter/labextensions/jupyter-gpumem/static/remoteEntry.")
        for n in names
    )
    assert f"{data}etc/jupyter/jupyter_server_config.d/jupyter_gpumem.json" in names


@pytest.fixture
def installed(wheel: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The wheel in a fresh virtualenv with Node off PATH: its python and environment."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _see_outer_packages(python)
    env = _without_node({**os.environ, "VIRTUAL_ENV": str(env_dir)})
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env.pop("PYTHONPATH", None)
    assert shutil.which("node", path=env["PATH"]) is None
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True, env=env,
    )  # fmt: skip
    return python, env


def test_wheel_installs_and_is_enabled_without_node(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    python, env = installed
    env_dir = tmp_path / "venv"
    imported = subprocess.run(
        [str(python), "-c", "import jupyter_gpumem; print(jupyter_gpumem.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(imported.stdout.strip()).is_relative_to(env_dir)
    prefix = env_dir / "share" / "jupyter" / "labextensions" / "jupyter-gpumem"
    assert (prefix / "package.json").exists()
    assert (
        env_dir / "etc" / "jupyter" / "jupyter_server_config.d" / "jupyter_gpumem.json"
    ).exists()
    labext = _run(python, "jupyterlab.labextensions", "list", env=env, cwd=tmp_path)
    assert f"{prefix.parent}\n        jupyter-gpumem v0.1.0 enabled OK" in labext
    server = _run(python, "jupyter_server.extension.serverextension", "list", env=env, cwd=tmp_path)
    assert f"Config dir: {env_dir / 'etc' / 'jupyter'}\n    jupyter_gpumem enabled" in server
    assert "jupyter_gpumem 0.1.0 OK" in server


@pytest.mark.timeout(600)
def test_the_demo_runs_the_quickstart_the_wheel_ships(
    wheel: Path, installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    assert "jupyter_gpumem/quickstart.ipynb" in zipfile.ZipFile(wheel).namelist()
    python, env = installed
    shipped = tmp_path / "venv" / "lib"
    out = _run(python, "jupyter_gpumem", "demo", env=env, cwd=tmp_path)
    found = re.search(
        r"^[1-9]\d* report\(s\) from (.*/jupyter_gpumem/quickstart\.ipynb)$", out, re.M
    )
    assert found is not None, out
    assert Path(found[1]).is_relative_to(shipped)
    assert "gpumem train:" in out  # the training cell's report, printed


def _see_outer_packages(python: Path) -> None:
    """Let the nested interpreter import what the running one can (Jupyter), after its own packages."""
    nested = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(nested.stdout.strip(), "outer-environment.pth").write_text(
        "".join(f"{path}\n" for path in outer)
    )


def _run(python: Path, module: str, *args: str, env: dict[str, str], cwd: Path) -> str:
    """Run a module of the nested interpreter outside the checkout, whose package would shadow the wheel."""
    result = subprocess.run(
        [str(python), "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return _plain(result.stdout + result.stderr)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
