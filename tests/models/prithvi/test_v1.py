"""hls-foundation-os v1 (mmseg) fine-tune layout: keys, the (e t) channel order, loading."""

from __future__ import annotations

import torch

from geoserve.models import load_checkpoint
from geoserve.models.prithvi.v1 import PrithviV1Segmentation, TokensToImageNeck

TINY = dict(embed_dim=32, depth=2, num_heads=2, in_chans=6, img_size=224, patch_size=16)


def test_mmseg_checkpoint_loads_and_runs(tmp_path):
    torch.manual_seed(0)
    model = PrithviV1Segmentation(
        num_classes=2, neck_dim=16, head_channels=8, num_frames=3, **TINY
    ).eval()
    state = {}
    for k, v in model.state_dict().items():
        state[k.replace("encoder.", "backbone.", 1)] = v
    state["auxiliary_head.conv_seg.weight"] = torch.zeros(2, 8, 1, 1)  # training only
    path = tmp_path / "multi_temporal_crop_classification_Prithvi_100M.pth"
    torch.save({"state_dict": state, "meta": {"epoch": 80}}, path)
    loaded = load_checkpoint(path, config={"num_heads": 2})
    keys = set(loaded.state_dict())
    assert {
        "neck.fpn1.1.ln.weight",
        "neck.fpn2.3.bias",
        "decode_head.convs.0.conv.weight",
        "decode_head.convs.0.bn.running_var",
        "decode_head.conv_seg.weight",
    } <= keys
    x = torch.randn(1, 6, 3, 224, 224)
    with torch.inference_mode():
        out = loaded(x)
        assert out.shape == (1, 2, 224, 224)
        assert torch.equal(out, model(x))


def test_neck_uses_e_t_channel_order():
    neck = TokensToImageNeck(embed_dim=4 * 3, out_dim=2)
    captured = {}
    neck.fpn1.register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    frames, h, w, e = 3, 2, 2, 4
    tokens = torch.zeros(1, 1 + frames * h * w, e)
    for t in range(frames):
        for d in range(e):
            tokens[0, 1 + t * h * w : 1 + (t + 1) * h * w, d] = 10 * d + t
    neck(tokens, frames, h, w)
    x = captured["x"]
    for d in range(e):
        for t in range(frames):
            assert (x[0, d * frames + t] == 10 * d + t).all()  # channel index d*T + t
