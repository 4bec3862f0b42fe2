"""Map tiles of predictions, computed on demand (``GET /v1/tiles/{z}/{x}/{y}.png``).

- :mod:`~geoserve.tiles.mercator`: WebMercator XYZ tiles (256 px): their bounds, transform,
  and the lowest zoom level at which a scene's tiles are predicted on demand;
- :mod:`~geoserve.tiles.plan`: which part of a scene a tile needs, cut so that the patches
  that cover the tile are exactly the full scene's patches (same pixels, same blending);
- :mod:`~geoserve.tiles.render`: a tile's pixels warped from the scene's grid and coloured
  (class colours, a confidence ramp, true colour), as PNG;
- :mod:`~geoserve.tiles.service`: putting them together on an
  :class:`~geoserve.engine.AsyncEngine`, with a :class:`~geoserve.engine.patch_cache.PatchCache`.
"""
