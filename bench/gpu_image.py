"""What the GPU machine's image holds, and so which wheels ``bench/gpu_prepare.sh`` must bring.

The image (Python 3.12, torch 2.11.0+cu130, numpy 2.5.2; no package index reachable there) is
described with that machine; :data:`IMAGE` is its package list as last read (2026-11-17).
:func:`wheels` walks geoserve's own requirements (``pyproject.toml``'s ``dependencies``, as
installed here) and theirs, and keeps each distribution the image lacks, pinned to the version
installed here (the one the tests ran with), less :data:`LEFT_OUT`:

    python -m bench.gpu_image            # one NAME==VERSION a line (gpu_prepare.sh reads it)
    python -m bench.gpu_image --modules  # the top-level modules that set provides

``tests/bench/test_gpu_image.py`` imports ``bench.gpu`` with nothing else importable (the image's
modules, these wheels' modules, the standard library, geoserve and bench) and smoke-runs it.
"""

from __future__ import annotations

import pkgutil
import re
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

#: Distributions in the GPU image ("cuda"), as documented with the machine.
_IMAGE_LIST = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
IMAGE = frozenset(_IMAGE_LIST.split())
#: Requirements left behind: what ``bench.gpu`` never imports, and why (a run carries 64 MiB).
LEFT_OUT = {"pyogrio": "GeoJSON / GeoPackage polygon outputs only (33 MB)"}
#: What the image's Python evaluates environment markers with.
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels(root: str = "geoserve") -> dict[str, str]:
    """Distribution -> version installed here, for each requirement of ``root`` (recursively,
    no extras) that the image lacks."""
    out: dict[str, str] = {}
    todo, seen = [root], set()
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(ENV):
                continue  # an extra, or another Python's
            dep = canonical(req.name)
            if dep in IMAGE or dep in LEFT_OUT:
                continue
            out[dep] = metadata.version(dep)
            todo.append(dep)
    return dict(sorted(out.items()))


def modules(dists: set[str]) -> set[str]:
    """The top-level modules the distributions ``dists`` (installed here) provide."""
    provided = metadata.packages_distributions()
    return {mod for mod, names in provided.items() if {canonical(n) for n in names} & dists}


def stdlib_modules() -> set[str]:
    """The standard library's top-level modules, private ones (``_sysconfigdata_*``) too."""
    dirs = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    dirs |= {str(Path(d) / "lib-dynload") for d in list(dirs)}
    found = {m.name for m in pkgutil.iter_modules(sorted(dirs))}
    return found | set(sys.stdlib_module_names) | set(sys.builtin_module_names)


def allowed_modules() -> set[str]:
    """Every top-level module importable on the GPU machine once the wheels are installed."""
    return (
        modules(set(IMAGE) | set(wheels()))
        | stdlib_modules()
        | {"geoserve", "bench", "_distutils_hack"}
    )


def main() -> None:
    if "--modules" in sys.argv:
        print("\n".join(sorted(modules(set(wheels())))))
    else:
        print("\n".join(f"{k}=={v}" for k, v in wheels().items()))


if __name__ == "__main__":
    main()
