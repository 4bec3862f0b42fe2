"""Models shipped with geoserve (registered through the ``geoserve.plugins`` entry point)."""
