"""The layers install as millstream.<layer>, never as bare top-level modules."""

from __future__ import annotations

import subprocess
import sys


def _imports(module: str, cwd: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, check=False).returncode == 0


def test_layers_import_only_under_millstream(tmp_path: object) -> None:
    for layer in ("state", "sinks", "connectors", "injectors"):
        assert _imports(f"millstream.{layer}", str(tmp_path)), f"millstream.{layer} missing"
        assert not _imports(layer, str(tmp_path)), f"a bare top-level {layer!r} is installed"


def test_public_api_is_small_and_explicit() -> None:
    import millstream

    assert "Computation" in millstream.__all__ and "Topology" in millstream.__all__
    assert all(hasattr(millstream, name) for name in millstream.__all__)


def test_every_subpackage_is_listed_for_a_non_editable_install() -> None:
    """An editable install finds any folder; `pip install .` only installs listed packages."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        "millstream." + ".".join(p.parent.relative_to(root / "millstream").parts)
        for p in (root / "millstream").rglob("__init__.py")
    }
    found = {name.rstrip(".") for name in found}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
