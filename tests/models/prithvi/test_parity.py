"""Parity with the reference implementation (TerraTorch's modules, random weights).

Small widths and depths: the architecture is under test, not the size.
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

from geoserve.models import load_checkpoint
from tests.models.prithvi.reference import load

TOL = 1e-4
SMALL = dict(embed_dim=64, depth=4, num_heads=4, in_chans=6, img_size=224)


@pytest.fixture(scope="module")
def ref():
    torch.manual_seed(0)
    return load()


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Max abs difference <= 1e-4, relative to the output's scale when that is above 1."""
    scale = max(1.0, float(expected.abs().max()))
    return float((got - expected).abs().max()) <= TOL * scale


def coords(batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    years = torch.tensor([[2018.0 + t, 26.0 + 40 * t] for t in range(frames)])
    temporal = years.unsqueeze(0).repeat(batch, 1, 1)
    location = torch.tensor([[-0.76, 38.1]] * batch)
    return temporal, location


def _randomize(module: torch.nn.Module) -> None:
    """Random weights scaled so activations neither vanish nor explode through the stack."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim >= 2:
                p.copy_(noise / max(1, p[0].numel()) ** 0.5)
            elif name.endswith("weight"):  # norm scales
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
        for name, b in module.named_buffers():  # BN statistics near the batch's own
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(1 + 0.2 * torch.rand(b.shape, generator=g))


@pytest.mark.parametrize("frames", [1, 3])
@pytest.mark.parametrize("size", [224, 512])
@pytest.mark.parametrize("with_coords", [False, True])
def test_encoder_features_match(ref, tmp_path, frames, size, with_coords):
    reference = ref.mae.PrithviViT(
        patch_size=(1, 16, 16),
        num_frames=frames,
        coords_encoding=["time", "location"],
        coords_scale_learn=True,
        **SMALL,
    ).eval()
    _randomize(reference)
    path = tmp_path / "bare_encoder.pt"
    torch.save(reference.state_dict(), path)  # bare keys, v1 style
    ours = load_checkpoint(path, config={"num_heads": 4})
    x = torch.randn(2, 6, frames, size, size)
    kw = {}
    if with_coords:
        kw["temporal_coords"], kw["location_coords"] = coords(2, frames)
    with torch.inference_mode():
        expected = reference.forward_features(x, **kw)
        got = ours.encoder.forward_features(x, **kw)
    assert len(got) == len(expected) == SMALL["depth"]
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        assert close(a, b)


@pytest.mark.parametrize("layout", ["v1_bare", "v2_prefixed", "safetensors"])
def test_mae_reconstruction_matches(ref, tmp_path, layout):
    reference = ref.mae.PrithviMAE(
        patch_size=(1, 16, 16),
        num_frames=3,
        decoder_embed_dim=32,
        decoder_depth=2,
        decoder_num_heads=4,
        coords_encoding=["time", "location"],
        coords_scale_learn=True,
        **SMALL,
    ).eval()
    _randomize(reference)
    state = reference.state_dict()
    if layout == "v1_bare":
        state = {k.split(".", 1)[1]: v for k, v in state.items()}
        path = tmp_path / "Prithvi_100M.pt"
        torch.save(state, path)
    elif layout == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "mae.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        path = tmp_path / "Prithvi_EO_V2.pt"
        torch.save(state, path)
    ours = load_checkpoint(path, config={"num_heads": 4, "decoder_num_heads": 4})
    x = torch.randn(2, 6, 3, 224, 224)
    temporal, location = coords(2, 3)
    with torch.inference_mode():
        latent, _, ids_restore = reference.encoder(x, temporal, location, mask_ratio=0.0)
        pred = reference.decoder(latent, ids_restore, temporal, location, input_size=x.shape)
        expected = reference.unpatchify(pred, image_size=(224, 224))
        got = ours(x, temporal, location)
    assert got.shape == expected.shape == x.shape
    assert close(got, expected)


def reference_pipeline(ref, frames: int, decoder: str = "upernet"):
    """TerraTorch's fine-tune pipeline (PixelWiseModel.forward): encoder, pyramid neck, UperNet
    (3 classes) or smp-0.5 UNet (5 classes), head; random live weights."""
    enc = ref.mae.PrithviViT(
        patch_size=(1, 16, 16),
        num_frames=frames,
        coords_encoding=["time", "location"],
        coords_scale_learn=True,
        **SMALL,
    )
    channels = [SMALL["embed_dim"] * frames] * 4
    neck = ref.necks.LearnedInterpolateToPyramidal(channels)
    levels = neck.process_channel_list(channels)
    if decoder == "upernet":
        dec = ref.upernet.UperNetDecoder(levels, channels=32)
        head = ref.heads.SegmentationHead(32, num_classes=3, dropout=0.1)
    else:
        dec = ref.unet.UNetDecoder(levels, [32, 16, 8, 4])
        head = ref.heads.SegmentationHead(4, num_classes=5, dropout=0.1)
    modules = torch.nn.ModuleDict({"encoder": enc, "neck": neck, "decoder": dec, "head": head})
    _randomize(modules)
    modules.eval()

    def forward(x, **kw):
        size = x.shape[-2:]
        x = ref.utils.pad_images(x, (1, 16, 16), "reflect")
        feats = enc.forward_features(x, **kw)
        gh, gw = x.shape[-2] // 16, x.shape[-1] // 16
        maps = [
            rearrange(feats[i][:, 1:], "b (t h w) e -> b (t e) h w", t=frames, h=gh, w=gw)
            for i in (0, 1, 2, 3)
        ]
        out = head(dec(neck(maps)))
        out = torch.nn.functional.interpolate(out, size=x.shape[-2:], mode="bilinear")
        return ref.utils.center_crop(out, size)

    return modules, forward


def checkpoint_state(modules, decoder: str, timm_wrapped: bool) -> dict:
    """The reference pipeline's weights as TerraTorch fine-tunes save them."""
    state = {}
    for k, v in modules.state_dict().items():
        if k.startswith("neck.") and decoder == "upernet":
            k = "decoder." + k[len("neck.") :]  # TerraTorch 1.1 kept the scale modules here
        elif k.startswith("neck."):
            k = "neck.2." + k[len("neck.") :]  # the pyramid is the third neck in the checkpoints
        if timm_wrapped and k.startswith("encoder."):
            k = "encoder._timm_module." + k[len("encoder.") :]
        state["model." + k] = v
    if decoder == "unet":
        return {"state_dict": state}
    return {"state_dict": state, "epoch": 3, "optimizer_states": [], "hyper_parameters": {}}


#: decoder -> (batch, classes) of its parity cases
FINE_TUNES = {"upernet": (2, 3), "unet": (1, 5)}


@pytest.mark.parametrize(
    ("decoder", "frames", "size", "timm_wrapped"),
    [
        *(
            pytest.param(
                "upernet",
                frames,
                size,
                timm,
                id=f"upernet-{frames}frames-{size}px{'-timm-wrapped' if timm else ''}",
            )
            for frames in (1, 3)
            for size in (224, 200)
            for timm in (False, True)
        ),
        *(
            pytest.param("unet", frames, size, False, id=f"unet-{frames}frames-{size}px")
            for frames, size in ((1, 512), (3, 224), (3, 200))
        ),
    ],
)
def test_fine_tune_logits_match(ref, tmp_path, decoder, frames, size, timm_wrapped):
    batch, classes = FINE_TUNES[decoder]
    modules, forward = reference_pipeline(ref, frames, decoder=decoder)
    path = tmp_path / f"{decoder}.ckpt"
    torch.save(checkpoint_state(modules, decoder, timm_wrapped), path)
    ours = load_checkpoint(path, config={"num_heads": 4, "feature_indices": (0, 1, 2, 3)})
    if decoder == "unet":
        assert ours.decoder.out_channels == 4
    x = torch.randn(batch, 6, frames, size, size)
    temporal, location = coords(batch, frames)
    with torch.inference_mode():
        expected = forward(x, temporal_coords=temporal, location_coords=location)
        got = ours(x, temporal_coords=temporal, location_coords=location)
    assert got.shape == (batch, classes, size, size)
    assert float(expected.std()) > 0.1  # a live network: the comparison is not vacuous
    assert close(got, expected)
