"""TerraMind's generated products: one output kind per generated modality.

:class:`GeneratedProducts` is the output processor of a
:class:`~geoserve.models.terramind.generate.TerraMindGenerate` model, whose output is every
generated modality's channels one after another (in the order it generates them). Each kind
is one product:

- ``s2l2a`` (12 bands, L2A digital numbers), ``s1grd`` and ``s1rtc`` (VV, VH in dB), ``dem``
  (metres), ``ndvi``: float32, in the units of TerraMind's pretraining statistics, NaN where
  the input is nodata;
- ``lulc``: the land-cover class map (uint8, a colour table, class names and the nodata value
  255), the argmax of the blended class logits; ``confidence``: the largest class
  probability there.

Overlapping patches are blended on the physical values (an affine map of the model's
standardised output, so blending before or after it is the same) and on the LULC logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from geoserve.errors import ConfigError
from geoserve.processors.base import OutputKind, OutputProcessor, RasterContext
from geoserve.processors.reassemblers import SegmentationReassembler, float_output
from geoserve.raster.write import OutputRaster

#: TerraMind v1's 10 LULC channels, named after the ESRI Annual Land Use / Land Cover
#: (Impact Observatory, 10 m) classes it was pretrained on, in the order of their codes
#: (0 no data, 1, 2, 4, 5, 7, 8, 9, 10, 11).
LULC_CLASSES = (
    "no data",
    "water",
    "trees",
    "flooded vegetation",
    "crops",
    "built area",
    "bare ground",
    "snow/ice",
    "clouds",
    "rangeland",
)
#: Their colours (the Esri legend's).
LULC_COLORS: tuple[tuple[int, int, int], ...] = (
    (0, 0, 0),
    (26, 91, 171),
    (53, 130, 33),
    (135, 209, 158),
    (255, 219, 92),
    (237, 2, 42),
    (237, 233, 228),
    (242, 250, 255),
    (200, 200, 200),
    (198, 173, 141),
)
#: Each generated modality: its kind, band names, and the unit written in its tags.
PRODUCTS: dict[str, tuple[tuple[str, ...], str]] = {
    "S2L2A": (
        (
            "B01",
            "B02",
            "B03",
            "B04",
            "B05",
            "B06",
            "B07",
            "B08",
            "B8A",
            "B09",
            "B11",
            "B12",
        ),
        "L2A digital number (reflectance x 10000)",
    ),
    "S1GRD": (("VV", "VH"), "dB"),
    "S1RTC": (("VV", "VH"), "dB"),
    "DEM": (("elevation",), "m"),
    "NDVI": (("NDVI",), "index"),
    "LULC": (LULC_CLASSES, "class"),
}
#: The kinds this processor offers.
KINDS: tuple[str, ...] = tuple(m.lower() for m in PRODUCTS) + ("confidence",)


def _modality(kind: str) -> str:
    return "LULC" if kind == "confidence" else kind.upper()


@dataclass(frozen=True)
class GeneratedProducts(OutputProcessor):
    """Output processor of TerraMind generation (see the module docstring).

    Args:
        kind: The product: a generated modality's kind, or ``confidence`` (LULC's).
        generated: The modalities the model generates, in its output's channel order (set at
            start-up from the configured model, :meth:`fitted`; empty: not known yet).
    """

    kind: OutputKind = "lulc"
    generated: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(
                f"TerraMind generation cannot produce {self.kind!r}; it offers {', '.join(KINDS)}"
            )
        unknown = [m for m in self.generated if m not in PRODUCTS]
        if unknown:
            raise ConfigError(f"unknown generated modalities {unknown}; known: {list(PRODUCTS)}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every generated modality's kind (the model's, once fitted) and ``confidence``."""
        if not self.generated:
            return KINDS
        own = tuple(m.lower() for m in self.generated)
        return own + (("confidence",) if "LULC" in self.generated else ())

    @property
    def out_channels(self) -> int | None:
        """Channels of every generated modality together (None before :meth:`fitted`)."""
        if not self.generated:
            return None
        return sum(len(PRODUCTS[m][0]) for m in self.generated)

    def fitted(self, model: Any) -> GeneratedProducts:
        """Fitted to what ``model`` (a configured ``TerraMindGenerate``) generates."""
        outputs = tuple(getattr(model, "outputs", ()) or ())
        if not outputs:
            raise ConfigError(f"{type(model).__name__} is no configured TerraMind generator")
        fitted = dataclasses.replace(self, generated=outputs)
        # (the model's own processor keeps its default kind only if it is generated)
        return fitted.for_kind(self.kind if self.kind in fitted.kinds else fitted.kinds[0])

    def for_kind(self, kind: str) -> GeneratedProducts:
        """The same model's ``kind`` product.

        Raises:
            ConfigError: a kind the model does not generate (naming the ones it does).
        """
        if kind not in self.kinds:
            how = (
                "; the server generates what its output kinds name (--output-kind)"
                if self.generated and kind in KINDS
                else ""
            )
            raise ConfigError(
                f"cannot produce {kind!r} output; this model generates {', '.join(self.kinds)}"
                + how
            )
        return dataclasses.replace(self, kind=kind)  # type: ignore[arg-type]

    def _slice(self, blended: NDArray[np.float32], modality: str) -> NDArray[np.float32]:
        if modality not in self.generated:
            raise ConfigError(f"the model was not configured to generate {modality}")
        start = 0
        for m in self.generated:
            n = len(PRODUCTS[m][0])
            if m == modality:
                return blended[start : start + n]
            start += n
        raise AssertionError("unreachable")

    def finalize(
        self,
        blended: NDArray[np.float32],
        valid: NDArray[np.bool_] | None,
        ctx: RasterContext,
    ) -> OutputRaster:
        """The kind's channels as its product (``blended`` itself is not changed)."""
        modality = _modality(self.kind)
        values = self._slice(blended, modality)
        if modality == "LULC":
            kind: OutputKind = "confidence" if self.kind == "confidence" else "classes"
            seg = SegmentationReassembler(classes=LULC_CLASSES, colors=LULC_COLORS, kind=kind)
            out = seg.finalize(values, valid, ctx)
            return dataclasses.replace(
                out, tags={**out.tags, "GEOSERVE_OUTPUT": self.kind, "TERRAMIND_OUTPUT": "LULC"}
            )
        names, unit = PRODUCTS[modality]
        tags = {"GEOSERVE_OUTPUT": self.kind, "TERRAMIND_OUTPUT": modality, "UNITS": unit}
        return float_output(values.copy(), valid, ctx.has_nodata, names, tags)
