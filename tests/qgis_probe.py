"""What QGIS makes of geoserve's products: run by the system Python that has QGIS's bindings.

``python3 tests/qgis_probe.py CLASSES.tif POLYGONS.gpkg ROW,COL ...`` loads the class map as
QGIS's desktop does (``QgsRasterLayer`` with its default style: sidecars and all), renders it
through the layer's own renderer and prints one JSON object: the renderer's type, its classes
and legend, the nodata value, the RGBA drawn at each ROW,COL, and the polygons layer's
validity and feature count. Needs nothing from geoserve (QGIS's Python is not the venv's).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from qgis.core import Qgis, QgsApplication, QgsRasterLayer, QgsVectorLayer  # noqa: E402
from qgis.PyQt.QtGui import QColor  # noqa: E402


def main(classes: str, polygons: str, pixels: list[str]) -> dict[str, object]:
    layer = QgsRasterLayer(classes, "classes")
    renderer = layer.renderer()
    provider = layer.dataProvider()
    found: dict[str, object] = {
        "valid": layer.isValid(),
        "renderer": renderer.type(),
        "legend": [
            [label, color.name(), color.alpha()] for label, color in renderer.legendSymbologyItems()
        ],
        "nodata": provider.sourceNoDataValue(1) if provider.sourceHasNoDataValue(1) else None,
    }
    if renderer.type() == "paletted":
        found["classes"] = [
            [int(c.value), c.label, c.color.name(), c.color.alpha()] for c in renderer.classes()
        ]
    block = renderer.block(1, layer.extent(), layer.width(), layer.height())
    drawn = {}
    for spec in pixels:
        row, col = (int(v) for v in spec.split(","))
        color = QColor.fromRgba(block.color(row, col))
        drawn[spec] = [color.red(), color.green(), color.blue(), color.alpha()]
    found["drawn"] = drawn
    vector = QgsVectorLayer(polygons, "polygons", "ogr")
    found["polygons_valid"] = vector.isValid()
    found["polygons_features"] = vector.featureCount() if vector.isValid() else None
    return found


if __name__ == "__main__":
    app = QgsApplication([], False)
    app.initQgis()
    result = main(sys.argv[1], sys.argv[2], sys.argv[3:])
    result["qgis"] = Qgis.QGIS_VERSION
    print(json.dumps(result))
    app.exitQgis()
