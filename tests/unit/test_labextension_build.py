"""The labextension's packaging agrees with the Python package and the wire format.

Checks the sources always, and the prebuilt extension (``jupyter_gpumem/labextension``)
when it has been built (``pip install -e .`` or ``npm run build:prod`` in labextension/).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem.report.record import MIME_TYPE

ROOT = Path(__file__).resolve().parents[2]
LABEXT = ROOT / "labextension"
BUILT = ROOT / "jupyter_gpumem" / "labextension"


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _pyproject_version() -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no static version"
    return match.group(1)


def test_package_json_matches_the_python_package() -> None:
    package = _json(LABEXT / "package.json")
    assert package["name"] == "jupyter-gpumem"
    assert package["version"] == _pyproject_version()
    lab = package["jupyterlab"]
    assert (LABEXT / lab["outputDir"]).resolve() == BUILT
    assert (LABEXT / lab["schemaDir"] / "plugin.json").is_file()
    # The entry points are built from these sources.
    assert lab["extension"] == "lib/index.js" and (LABEXT / "src" / "index.ts").is_file()
    assert lab["mimeExtension"] == "lib/mime.js" and (LABEXT / "src" / "mime.ts").is_file()
    assert "build:prod" in package["scripts"]
    install = _json(LABEXT / "install.json")
    assert install["packageName"] == "jupyter_gpumem"


def test_settings_schema_offers_interval_and_units() -> None:
    schema = _json(LABEXT / "schema" / "plugin.json")
    properties = schema["properties"]
    assert properties["interval"]["minimum"] == 0.25
    assert properties["units"]["enum"] == ["GiB", "GB"]
    assert schema["additionalProperties"] is False


def test_renderer_mime_type_is_the_kernels() -> None:
    types_ts = (LABEXT / "src" / "wire" / "report.ts").read_text(encoding="utf-8")
    match = re.search(r"REPORT_MIME_TYPE = '([^']+)'", types_ts)
    assert match is not None
    assert match.group(1) == MIME_TYPE


@pytest.mark.skipif(not (BUILT / "package.json").is_file(), reason="labextension not built")
def test_prebuilt_extension_is_complete() -> None:
    package = _json(BUILT / "package.json")
    assert package["name"] == "jupyter-gpumem"
    assert package["version"] == _pyproject_version()
    build = package["jupyterlab"]["_build"]
    assert build["extension"] == "./extension"
    assert build["mimeExtension"] == "./mimeExtension"
    assert (BUILT / build["load"]).is_file()
    assert (BUILT / "static" / "style.js").is_file()
    assert (BUILT / "schemas" / "jupyter-gpumem" / "plugin.json").is_file()
