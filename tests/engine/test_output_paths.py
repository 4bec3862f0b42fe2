"""One rule for where outputs go, the Python API's and the CLI's alike."""

from __future__ import annotations

import numpy as np
import pytest

from geoserve import Engine
from geoserve.cli import main
from tests.conftest import write_geotiff


@pytest.mark.parametrize("form", ["existing", "existing/", "new/"])
def test_a_single_input_into_a_directory_is_named_after_it(tmp_path, form):
    """Was: the Python API wrote the file *as* the directory ('Is a directory')."""
    data = np.random.default_rng(0).integers(1, 4000, (3, 40, 50)).astype("uint16")
    scene = write_geotiff(tmp_path / "scene.tif", data)
    (tmp_path / "existing").mkdir()
    target = tmp_path / form.rstrip("/")
    with Engine("test-seg") as engine:
        api = engine.generate_image(scene, output_path=f"{tmp_path}/{form}").outputs.path
    assert api is not None
    assert api.parent == target
    assert api.name.startswith("scene")
    cli_dir = tmp_path / f"cli-{form}"
    if form.startswith("existing"):
        cli_dir.mkdir(exist_ok=True)
    assert main(["predict", str(scene), "-o", str(cli_dir) + "/", "--model", "test-seg", "-q"]) == 0
    tifs = [p.name for p in cli_dir.iterdir() if p.suffix == ".tif"]
    assert tifs == [api.name]  # (beside it, the class map's .aux.xml colour table)


def test_a_directory_that_cannot_be_made_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    data = np.ones((3, 20, 20), "uint16")
    scene = write_geotiff(tmp_path / "s.tif", data)
    with (
        Engine("test-seg") as engine,
        pytest.raises(Exception, match="cannot create the directory"),
    ):
        engine.generate_image(scene, output_path=str(blocker / "sub") + "/")
