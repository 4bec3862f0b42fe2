"""Measure the ``s1s2-water`` fusion rule on a Sen1Floods11 hand-labelled chip; write its card.

    .venv/bin/python scripts/eval_s1s2_water.py [--sen1floods11 DIR] [--dry-run]   # ~30 s

Runs the real engine (``Engine("s1s2-water")``) on the chip Spain_7370579 five ways, and scores
each map's water class (IoU) against the hand labels (pixels labelled -1 excluded; an output
nodata pixel counts as "not water", a pixel the map failed to call):

- S2 alone (the NDWI rule), S1 alone (VV < -15 dB), S2 + S1 fused;
- with the left third of the S2 chip masked as cloud (every band of columns 0 to
  ``512 // 3 - 1`` = 169, all rows, set to its nodata value 0): fused, and S2 alone.

Writes the figures (``s1s2_water.json``) and the model card (``s1s2_water.md``) into
src/geoserve/models/weights/, unless ``--dry-run``. The chip comes from Sen1Floods11 (Bonafilia
et al., CVPR Workshops 2020; not bundled, see scripts/train_demo_model.py for where to get it):

    Spain_7370579_S2Hand.tif     Sentinel-2 L1C, 13 bands, int16, nodata 0
    Spain_7370579_S1Hand.tif     Sentinel-1 GRD, VV and VH in dB, float32, NaN nodata
    Spain_7370579_LabelHand.tif  hand labels: -1 no data, 0 not water, 1 water
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import rasterio

ROOT = Path(__file__).resolve().parents[1]
SEN1FLOODS11 = ROOT.parent / "shared" / "data"
S2, S1, LABEL = (
    "Spain_7370579_S2Hand.tif",
    "Spain_7370579_S1Hand.tif",
    "Spain_7370579_LabelHand.tif",
)
OUT = ROOT / "src" / "geoserve" / "models" / "weights"
MACHINE, DATE = "2-core x86 CPU", "2026-12-01"


def mask_left_third(chip: Path, dest: Path) -> Path:
    """``chip`` with every band of its left third of columns (0 to width // 3 - 1) set to 0."""
    with rasterio.open(chip) as src:
        data, profile, names = src.read(), src.profile, src.descriptions
    data[:, :, : data.shape[2] // 3] = 0
    with rasterio.open(dest, "w", **profile) as dst:
        dst.write(data)
        dst.descriptions = names
    return dest


def water_iou(pred: np.ndarray, truth: np.ndarray) -> float:
    """IoU of the water class over labelled pixels (pred 1 is water; 0 and nodata are not)."""
    valid = truth >= 0
    water, real = (pred == 1) & valid, (truth == 1) & valid
    return round(float((water & real).sum() / (water | real).sum()), 4)


def evaluate(data: Path) -> dict[str, float]:
    """The five water IoUs of ``s1s2-water`` on the chip in ``data``."""
    from geoserve import Engine

    with rasterio.open(data / LABEL) as lab:
        truth = lab.read(1)
    engine = Engine("s1s2-water")
    with tempfile.TemporaryDirectory() as tmp:
        masked = str(mask_left_third(data / S2, Path(tmp) / "s2_masked.tif"))
        s2, s1 = str(data / S2), str(data / S1)
        requests: Mapping[str, Mapping[str, str]] = {
            "s2_only": {"s2": s2},
            "s1_only": {"s1": s1},
            "fused": {"s2": s2, "s1": s1},
            "fused_masked": {"s2": masked, "s1": s1},
            "s2_only_masked": {"s2": masked},
        }
        figures = {}
        for key, request in requests.items():
            result = engine.generate_image(request, out_format="tensor").raise_for_error()
            figures[f"{key}_water_iou"] = water_iou(result.outputs.tensor[0].numpy(), truth)
    engine.close()
    return figures


CARD_TEXT = """# Model card: s1s2-water

A fixed-rule water map fusing Sentinel-2 (optical) with Sentinel-1 (radar): no learning, no
weights. The baseline a learned fusion model must beat, and a working example of a
multimodal request (`{{"s2": ..., "s1": ...}}`).

- Rule, per pixel of the model's grid (the `s2` input's, else the `s1` input's):
  water where NDWI = (B3 - B8) / (B3 + B8) > 0 where `s2` has data; where `s2` is nodata
  (clouds masked upstream) or not given, water where VV < -15 dB; nodata where both are
  nodata. Logits (-k, +k) x score with k = 10, score = NDWI, or (-15 dB - VV) / 30 dB.
- Inputs, both optional: `s2`, Sentinel-2 with bands `B3` and `B8` (by description, or by
  index with `--bands`), reflectance x 10000, its nodata marking clouds; `s1`, Sentinel-1 with
  band `VV` in dB or linear power (the `UNITS` tag, `dB` or `linear`, else the band's unit,
  else dB; `S1S2Patcher(s1_units=...)` overrides), warped bilinearly onto the `s2` grid. 224-px
  patches, centre blend.
- Evaluation: `scripts/eval_s1s2_water.py`, through the engine, on the Sen1Floods11
  hand-labelled chip Spain_7370579 (Spain, 2019 flood; S1 and S2 on one 512 x 512 EPSG:4326
  grid), water IoU against the hand labels (pixels labelled -1 excluded; an output nodata
  pixel counts as not water). "Masked": every band of the S2 chip's columns 0 to 169 (the left
  third, 512 // 3 columns, all rows) set to its nodata value 0, as if under cloud.
  Measured by the geoserve developers on a {machine}, {date}; data: Sen1Floods11 chip
  Spain_7370579.

| request | water IoU |
| --- | --- |
| S2 alone (NDWI > 0) | {s2_only_water_iou:.3f} |
| S1 alone (VV < -15 dB) | {s1_only_water_iou:.3f} |
| S2 + S1 fused (the chip's S2 has no nodata: this is the S2 map) | {fused_water_iou:.3f} |
| S2 with its left third masked, + S1 | {fused_masked_water_iou:.3f} |
| S2 with its left third masked, alone | {s2_only_masked_water_iou:.3f} |

- Limits: one chip of one flood; fixed thresholds (NDWI 0, VV -15 dB) that are not tuned
  for any scene; S2 pixels under unmasked cloud, cloud shadow or snow are taken at face value,
  and only a masked (nodata) S2 pixel falls back to radar. Radar misses flooded vegetation and
  calls smooth dry surfaces (tarmac, sand, radar shadow) water.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sen1floods11",
        type=Path,
        default=Path(os.environ.get("SEN1FLOODS11_DIR", SEN1FLOODS11)),
        metavar="DIR",
        help=f"directory with {S2}, {S1} and {LABEL} "
        f"(default: $SEN1FLOODS11_DIR, else {SEN1FLOODS11})",
    )
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args()
    missing = [n for n in (S2, S1, LABEL) if not (args.sen1floods11 / n).is_file()]
    if missing:
        parser.error(f"{', '.join(missing)} not in {args.sen1floods11}; pass --sen1floods11 DIR")
    figures = evaluate(args.sen1floods11)
    card = {**figures, "machine": MACHINE, "date": DATE}
    print(json.dumps(card, indent=2))
    if not args.dry_run:
        (OUT / "s1s2_water.json").write_text(json.dumps(card, indent=2) + "\n")
        (OUT / "s1s2_water.md").write_text(CARD_TEXT.format(machine=MACHINE, date=DATE, **figures))


if __name__ == "__main__":
    sys.exit(main())
