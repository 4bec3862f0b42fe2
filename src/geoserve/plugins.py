"""Plugin discovery through the ``geoserve.plugins`` entry-point group.

A plugin package declares, in its ``pyproject.toml``::

    [project.entry-points."geoserve.plugins"]
    my_models = "my_package.models:register"

``register()`` takes no arguments and registers models with the registry decorators (usually
just by importing the module that holds them, which makes it safe to call twice). geoserve's own
built-in models arrive the same way. ``GEOSERVE_PLUGINS`` (comma-separated entry-point names)
limits which plugins load; a plugin named there but not installed is an error, while an
installed plugin that fails to import is logged and skipped, so one broken package cannot take
the others down.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from geoserve.errors import PluginLoadError

GROUP = "geoserve.plugins"
logger = logging.getLogger(__name__)
_loaded: set[str] = set()


def load_plugins(allow: list[str] | None = None) -> list[str]:
    """Load every (allowed) installed plugin once; return the names loaded so far.

    Raises:
        PluginLoadError: a plugin named in ``allow`` / ``GEOSERVE_PLUGINS`` is not installed.
    """
    if allow is None:
        env = os.environ.get("GEOSERVE_PLUGINS", "").strip()
        allow = [n.strip() for n in env.split(",") if n.strip()] if env else None
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    if allow is not None:
        missing = sorted(set(allow) - set(eps) - {"builtin"})
        if missing:
            raise PluginLoadError(
                f"plugin(s) {', '.join(missing)} requested but not installed; "
                f"installed: {', '.join(sorted(eps)) or '(none)'}"
            )
    # the built-in models are always available, even from a source tree that is not installed
    _load_builtin()
    for name, ep in sorted(eps.items()):
        if name in _loaded or (allow is not None and name not in allow and name != "builtin"):
            continue
        try:
            ep.load()()
        except Exception as exc:  # one line; the traceback at debug level (--debug)
            logger.error("plugin %r (%s) failed to load, skipped: %r", name, ep.value, exc)
            logger.debug("plugin %r traceback", name, exc_info=True)
            continue
        _loaded.add(name)
    return sorted(_loaded)


def _load_builtin() -> None:
    if "builtin" not in _loaded:
        from geoserve.models.builtin import register

        register()
        _loaded.add("builtin")
