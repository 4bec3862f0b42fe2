"""Which bands of a STAC Item input a request reads: the model's processor asked.

An Item input (:mod:`geoserve.raster.stac_item`) is opened as one stack of the bands the
request's input processor reads (:func:`geoserve.raster.stac_stack.open_item`):

- a single input, or the dates of one place: the processor's bands
  (:meth:`~geoserve.processors.InputProcessor.band_selectors`);
- a modality of a multimodal model: that modality's bands;
- a modality of a dict request to a model that takes one stack (the modalities are stacked):
  the processor's bands that the Item has (every band when it reads all).

A processor that selects bands by position and declares their roles (``demo-water``:
``BLUE`` ... ``SWIR_2``) reads an Item by those roles: for the request it selects them by
name (:func:`stac_processor`).

A STAC search (:class:`~geoserve.stac_query.StacSearch`, the request's one input) is run when
the request is opened, for the processor's bands and dates (:func:`open_search`): it becomes
the cube of the scenes found (:mod:`geoserve.raster.stac_mosaic`), one input per date.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geoserve.errors import GeoServeError, InputError, prefixed
from geoserve.processors.base import InputProcessor
from geoserve.raster.source import DataFormat, RasterLike, RasterSource, open_raster
from geoserve.raster.stac_item import StacItem, is_stac_input
from geoserve.raster.stac_stack import open_item, roles_for, wanted_bands
from geoserve.stac_query import StacSearch


def open_search(
    proc: InputProcessor, inputs: Sequence[RasterLike], kw: Mapping[str, Any]
) -> list[RasterLike]:
    """A request whose input is a STAC search: the search run, its cube one input per date.

    Other requests' inputs are returned as they are. ``kw``: :func:`open_raster`'s keywords
    for each file the search's Items name.

    Raises:
        InputError: a search among other inputs, or one that finds nothing to read (naming
            the search); BandMismatchError: a band the Items lack.
    """
    searches = [x for x in inputs if isinstance(x, StacSearch)]
    if not searches:
        return list(inputs)
    if len(inputs) != 1:
        raise InputError(f"{searches[0].name}: a STAC search is a request's only input")
    from geoserve.raster.cube import cube_rasters
    from geoserve.raster.stac_mosaic import search_cube

    def opener(href: str) -> RasterSource:
        return open_raster(href, "url", **kw)

    cube = search_cube(searches[0], proc.band_selectors(), max(1, proc.num_frames), opener)
    return list(cube_rasters(cube))


@dataclass(frozen=True)
class StacPlan:
    """The bands to read from each Item input of a request (or of one of its modalities).

    Attributes:
        selectors: The processor's band selectors (``None``: every band).
        partial: Read those of them the Item has (a modality stacked with others).
    """

    selectors: Sequence[int | str] | None
    partial: bool = False

    @classmethod
    def of(cls, proc: InputProcessor, modality: str | None = None) -> StacPlan:
        """The plan for ``proc``'s inputs, or for its ``modality`` of a dict request."""
        multimodal = type(proc).prepare_modalities is not InputProcessor.prepare_modalities
        selectors = proc.band_selectors(modality if multimodal else None)
        return cls(selectors, partial=modality is not None and not multimodal)

    def open(self, item: RasterLike, kw: Mapping[str, Any]) -> RasterSource:
        """The Item input ``item`` opened as one stack (``kw``: :func:`open_raster`'s).

        Raises:
            GeoServeError: a subclass naming the Item, and the asset and file at fault.
        """
        stac = StacItem.of(item)
        try:
            wanted = wanted_bands(self.selectors)
        except GeoServeError as exc:
            raise prefixed(exc, stac.name) from None

        def opener(href: str) -> RasterSource:
            if stac.vet is not None:  # the server's allow-lists, before anything is opened
                href = stac.vet(href)
            kind: DataFormat = "url" if href.startswith(("http://", "https://")) else "path"
            return open_raster(href, kind, **kw)

        return open_item(stac, wanted, opener, int(kw.get("threads", 1)), self.partial)


def stac_processor(
    proc: InputProcessor,
    inputs: Sequence[RasterLike] | Mapping[str, Sequence[RasterLike]],
    data_format: str,
) -> InputProcessor:
    """``proc`` for a request: with Item inputs, positional bands replaced by their roles.

    Unchanged without Item inputs, or when it selects bands by name (or reads every band),
    or declares no roles.
    """
    flat = [x for v in inputs.values() for x in v] if isinstance(inputs, Mapping) else inputs
    roles = getattr(proc, "band_roles", None)
    if (
        roles is not None
        and roles_for(proc.band_selectors(), roles)
        and any(
            isinstance(x, StacSearch) or is_stac_input(x, data_format, sniff=False) for x in flat
        )
    ):
        return proc.replace(bands=tuple(roles), band_roles=tuple(roles))
    return proc
