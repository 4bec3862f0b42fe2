"""Whether a Python outside the virtual environment (Debian's) can import a module.

For tests that open products the way GIS users' tools do (Debian's GDAL, QGIS).
"""

from __future__ import annotations

import subprocess


def imports(python: str, module: str) -> bool:
    """Whether ``python -c "import <module>"`` succeeds (within a minute)."""
    try:
        found = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0
