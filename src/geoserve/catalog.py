"""What the model registry holds, for people and for scripts (``geoserve models [--json]``).

Each registered model becomes one :class:`ModelEntry`: where it comes from (the installed
package that registered it), what it reads and writes, and whether it needs a weights file.
:func:`format_table` fits the entries to a terminal width; the JSON form keeps every detail.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import packages_distributions
from typing import Any

from geoserve.errors import GeoServeError

#: Class names are listed in the table when they fit in this many characters ("13 classes" else).
CLASS_LIST_WIDTH = 16
#: Band lists longer than this many characters are shown as a count.
BAND_LIST_WIDTH = 20
#: A description column narrower than this (and than the longest description) moves the
#: descriptions to lines of their own.
MIN_DESCRIPTION_WIDTH = 40

HEADER = ("MODEL", "PLUGIN", "BANDS", "OUTPUT", "WEIGHTS", "DESCRIPTION")


@dataclass
class ModelEntry:
    """One registered model, as ``geoserve models`` describes it."""

    name: str
    plugin: str
    description: str
    weights: (
        str  # "required", "built in" (geoserve's own), "registered" (configured), "Hub" or "none"
    )
    weights_hint: str = ""
    input_description: str = ""  # what it takes, in words (ModelSpec.input_description)
    bands: list[int | str] | None = None  # None: every band of the input
    num_frames: int = 1
    modalities: dict[str, list[int | str] | None] | None = None  # a multimodal model's
    patch_size: int | None = None
    output: str = "raw"  # the default output kind: classes, probabilities, raw, ...
    kinds: list[str] = field(default_factory=list)  # every kind it can produce (--output-kind)
    classes: list[str] = field(default_factory=list)
    validated: list[str] = field(default_factory=list)  # speed options checked (--quantize)
    # its converted forms in the default cache (--backend openvino): key parts, gate figures
    converted: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # why the model cannot be used (a processor is missing)

    def cells(self) -> dict[str, str]:
        """The table's cells, with short forms of the long lists."""
        if self.error is not None:
            cells = ("-", "unusable", "-", self.error)
        else:
            bands = _ranges(self.bands) if self.bands else "all"
            if len(bands) > BAND_LIST_WIDTH:
                bands = f"{len(self.bands or ())} bands"
            if self.modalities:  # "s2: B3,B8; s1: VV", or just the modality names
                bands = "; ".join(
                    f"{m}: {_ranges(b) if b else 'all'}" for m, b in self.modalities.items()
                )
                if len(bands) > BAND_LIST_WIDTH:
                    bands = "+".join(self.modalities)
                if len(bands) > BAND_LIST_WIDTH:
                    bands = f"{len(self.modalities)} modalities"
            if self.num_frames > 1:
                bands += f" ({self.num_frames} dates)"
            output = ",".join(self.classes) if self.classes else self.output
            if len(output) > CLASS_LIST_WIDTH:
                output = f"{len(self.classes)} classes"
            cells = (bands, output, self.weights, self.description)
        return dict(zip(HEADER, (self.name, self.plugin, *cells), strict=True))

    def as_json(self) -> dict[str, Any]:
        """Every field, for ``--json``."""
        return asdict(self)


def source_of(spec: Any) -> tuple[str, str]:
    """(plugin, weights) of a registered model, as :class:`ModelEntry` says them.

    ``weights``: "required" (a weights file must be given), "registered" (a configured
    fine-tune's checkpoint), "built in", "none", or "Hub" (the factory fetches them).
    """
    plugin = plugin_of(spec.factory)
    if getattr(spec.factory, "configured_files", None) is not None:
        plugin = "configured"  # from a fine-tune config (geoserve.models.configured)
    if spec.weights_required:
        return plugin, "required"
    if plugin == "configured":
        return plugin, "registered"
    if getattr(spec, "loads_weights", False) and plugin != "geoserve":
        return plugin, "Hub"  # (the factory finds the published weights itself)
    return plugin, "built in" if plugin == "geoserve" else "none"


def servable_models(*, hub: bool = False) -> list[str]:
    """Every registered model that runs without a weights file given (``serve --model '*'``).

    Installed plugins are loaded first. ``hub``: also those whose factory fetches published
    weights from the Hub.
    """
    from geoserve.plugins import load_plugins
    from geoserve.registry import MODEL_REGISTRY

    load_plugins()
    ok = {"built in", "none", "registered"} | ({"Hub"} if hub else set())
    return [name for name, spec in sorted(MODEL_REGISTRY.items()) if source_of(spec)[1] in ok]


def model_entries() -> list[ModelEntry]:
    """Every registered model (installed plugins loaded first), by name."""
    from geoserve.engine import resolve_model
    from geoserve.engine.converted_cache import converted_of
    from geoserve.engine.products import kinds_offered
    from geoserve.plugins import load_plugins
    from geoserve.registry import MODEL_REGISTRY

    load_plugins()
    entries = []
    for name, spec in sorted(MODEL_REGISTRY.items()):
        plugin, weights = source_of(spec)
        entry = ModelEntry(
            name, plugin, spec.description, weights, spec.weights_hint, spec.input_description
        )
        entry.validated = list(spec.validated)
        entry.converted = converted_of(name)
        try:
            _, inp, out = resolve_model(spec)
        except GeoServeError as exc:
            entry.error = str(exc)
        else:
            selected = getattr(inp, "bands", None)
            entry.bands = list(selected) if selected else None
            entry.num_frames = inp.num_frames
            modalities = getattr(inp, "modalities", None)
            if modalities:
                entry.modalities = {m.name: list(m.bands) if m.bands else None for m in modalities}
            entry.patch_size = getattr(inp, "patch_size", None)
            entry.output = out.kind
            entry.kinds = list(kinds_offered(spec, out))
            entry.classes = list(getattr(out, "classes", ()) or ())
        entries.append(entry)
    return entries


def plugin_of(obj: Any) -> str:
    """The installed distribution whose code defines ``obj`` (its top-level module if none)."""
    top = str(getattr(obj, "__module__", "") or "?").split(".")[0]
    dists = _distributions().get(top)
    return dists[0] if dists else top


def format_table(entries: list[ModelEntry], width: int) -> list[str]:
    """The entries as aligned columns, every line at most ``width`` characters.

    One line per model when the description fits beside the other columns (cut with "…");
    otherwise the description goes on an indented line below, and on a narrower terminal
    the plugin's name joins it there.
    """
    rows = [dict(zip(HEADER, HEADER, strict=True)), *(e.cells() for e in entries)]
    layouts = (
        (HEADER, ()),
        (HEADER[:-1], ("DESCRIPTION",)),
        (("MODEL", "BANDS", "OUTPUT", "WEIGHTS"), ("PLUGIN", "DESCRIPTION")),
    )
    for columns, below in layouts:
        widths = {c: max(len(r[c]) for r in rows) for c in columns}
        if not below:  # the description takes what is left, if that is enough
            room = width - sum(widths[c] + 2 for c in columns[:-1])
            if room < min(MIN_DESCRIPTION_WIDTH, max(len(r["DESCRIPTION"]) for r in rows)):
                continue
            widths[columns[-1]] = room
        if sum(widths.values()) + 2 * (len(columns) - 1) <= width or below == layouts[-1][1]:
            break
    lines = []
    for i, row in enumerate(rows):
        line = "  ".join(_cut(row[c], widths[c]).ljust(widths[c]) for c in columns)
        lines.append(_cut(line.rstrip(), width))
        if below and i:
            lines.append(_cut("    " + ": ".join(row[c] for c in below if row[c]), width))
    return lines


def footer_lines(entries: list[ModelEntry], width: int) -> list[str]:
    """Below the table: each group of models' output kinds, and the int8-validated models."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for e in entries:
        if e.error is None:
            groups.setdefault(tuple(e.kinds), []).append(e.name)
    lines = ["", "output kinds (--output-kind, several comma-separated):"]
    for kinds, names in sorted(groups.items(), key=lambda g: -len(g[1])):
        who = ", ".join(names) if len(names) <= 3 else f"{len(names)} models"
        lines.append(_cut(f"  {', '.join(kinds)}: {who}", width))
    checked = [e.name for e in entries if "int8" in e.validated]
    lines += [
        "",
        _cut(f"--quantize int8 (CPU) validated on real data: {', '.join(checked) or '-'}", width),
        _cut("  others: check first with geoserve bench-accuracy --quantize int8 SCENE.tif", width),
    ]
    return lines


def _ranges(values: list[int | str]) -> str:
    """``[0, 1, 2, 3, 8]`` as "0-3,8" (names as they are)."""
    parts: list[str] = []
    run: list[int] = []
    for v in [*values, None]:
        if isinstance(v, int) and (not run or v == run[-1] + 1):
            run.append(v)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
            run = []
        if isinstance(v, int):
            run = [v]
        elif v is not None:
            parts.append(v)
    return ",".join(parts)


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return packages_distributions()  # (reads every installed package's file list: once)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
