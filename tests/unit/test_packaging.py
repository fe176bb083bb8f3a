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
