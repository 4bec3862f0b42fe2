"""``s1s2-water``: a fixed-rule water map fusing Sentinel-2 (optical) with Sentinel-1 (radar).

The rule, per pixel of the Sentinel-2 grid (the first modality the request gives):

- where ``s2`` is valid: water where NDWI = (B3 - B8) / (B3 + B8) > 0 (as ``ndwi-water``);
- where ``s2`` is nodata (clouds masked upstream) or not given: water where VV < -15 dB
  (open water is a specular reflector: dark in radar);
- nodata where both are nodata.

Both modalities are optional, so a request may give either or both. VV may be stored in dB or
as linear power: the input's ``UNITS`` tag (``dB`` or ``linear``, any case), else its VV band's
unit, else dB; :attr:`S1S2Patcher.s1_units` overrides them. The processor decides per request
and passes it to the forward as ``s1_linear``. Not learned: the baseline a fusion model must
beat. Its measured quality is in ``weights/s1s2_water.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from geoserve.errors import BandMismatchError, ConfigError, InputError
from geoserve.models.builtin import NDWI_SHARPNESS
from geoserve.processors import Modality, MultimodalPatcher, SegmentationReassembler
from geoserve.processors.base import Modalities, RasterContext
from geoserve.raster.bands import resolve_bands
from geoserve.raster.source import RasterSource
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

#: Water where VV (dB) is below this.
VV_THRESHOLD_DB = -15.0
#: dB below the threshold that weigh like an NDWI of 1 in the logits: 3 dB, like an NDWI of
#: 0.1, give a water probability of about 0.88.
VV_DB_PER_NDWI = 30.0
#: Smallest linear power taken before log10 (a 0 becomes -300 dB: water).
TINY = 1e-30
DB_UNITS = ("db", "decibel", "decibels")
LINEAR_UNITS = ("linear", "power", "intensity")


@dataclass(frozen=True)
class S1S2Patcher(MultimodalPatcher):
    """A :class:`MultimodalPatcher` that also tells the model the unit of the ``s1`` input.

    Args:
        s1_units: ``"db"``, ``"linear"`` (power), or ``"auto"``: the input's ``UNITS`` tag,
            else its VV band's unit, else dB.
    """

    s1_units: Literal["auto", "db", "linear"] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.s1_units not in ("auto", "db", "linear"):
            raise ConfigError(f"invalid s1_units {self.s1_units!r}; choose auto, db or linear")

    def prepare_modalities(
        self, modalities: Modalities, threads: int = 1
    ) -> tuple[list[RasterSource], RasterContext]:
        """As :class:`MultimodalPatcher`'s, plus the model argument ``s1_linear`` (1,): 1 or 0."""
        linear = "s1" in modalities and self.s1_is_linear(modalities["s1"])
        flat, ctx = super().prepare_modalities(modalities, threads)
        kwargs = {**ctx.model_kwargs, "s1_linear": np.array([float(linear)], np.float32)}
        return flat, dataclasses.replace(ctx, model_kwargs=kwargs)

    def s1_is_linear(self, sources: Sequence[RasterSource]) -> bool:
        """Whether the S1 input holds linear power rather than dB.

        Raises:
            InputError: the input declares a unit that is neither.
        """
        if self.s1_units != "auto":
            return self.s1_units == "linear"
        info = sources[0].info
        tags = {str(k).upper(): v for k, v in info.tags.items()}
        unit, where = tags.get("UNITS"), "UNITS tag"
        if not unit:
            try:
                band = resolve_bands(info, self.band_selectors("s1"))[0]
            except BandMismatchError:
                return False  # (refused next, naming the modality)
            unit = info.units[band] if band < len(info.units) else None
            where = "VV band's unit"
        name = str(unit or "dB").strip().lower()
        if name in DB_UNITS:
            return False
        if name in LINEAR_UNITS:
            return True
        raise InputError(
            f"modality 's1': {info.name}: its {where} is {unit!r}, neither dB nor linear power"
        )


@MODEL_REGISTRY.register_model(
    "s1s2-water",
    description="water: NDWI > 0 from Sentinel-2 where valid, else Sentinel-1 VV < -15 dB",
    input_description="s2: Sentinel-2 reflectance x 10000 with bands described B3 and B8; s1: "
    "Sentinel-1 with a band described VV (dB or linear power); either may be absent",
)
@INPUT_REGISTRY.register_input_processor(
    S1S2Patcher(
        modalities=(
            Modality("s2", bands=("B3", "B8"), scale_factor=1e-4, required=False, fill=np.nan),
            Modality("s1", bands=("VV",), required=False, fill=np.nan),
        ),
        patch_size=224,
        blend="center",
    )
)
@OUTPUT_REGISTRY.register_output_processor(
    SegmentationReassembler(
        classes=("not water", "water"), colors=((230, 230, 220), (31, 120, 220))
    )
)
class S1S2Water(nn.Module):
    """Two-class logits (-k, +k) x score: NDWI where S2 is valid, else (-15 dB - VV) / 30."""

    def forward(
        self, x: dict[str, torch.Tensor], s1_linear: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``s2`` (B, 2, H, W) green/NIR reflectance, ``s1`` (B, 1, H, W) VV -> logits."""
        ref = next(iter(x.values()))
        score = torch.full_like(ref[:, :1], float("nan"))
        if "s1" in x:
            vv = x["s1"][:, :1]
            if s1_linear is not None:
                linear = s1_linear.reshape(-1, 1, 1, 1) > 0.5
                vv = torch.where(linear, 10 * torch.log10(vv.clamp_min(TINY)), vv)
            score = (VV_THRESHOLD_DB - vv) / VV_DB_PER_NDWI
        if "s2" in x:
            green, nir = x["s2"][:, 0:1], x["s2"][:, 1:2]
            ndwi = (green - nir) / (green + nir).abs().clamp_min(1e-6)
            score = torch.where(ndwi.isnan(), score, ndwi)
        score = score.nan_to_num(0.0)  # nodata in both: the output is nodata there anyway
        return torch.cat([-score, score], dim=1) * NDWI_SHARPNESS
