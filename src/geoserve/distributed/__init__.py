"""Running geoserve on a Ray cluster (extra ``geoserve[ray]``); imported lazily."""

from geoserve.distributed.batch import BatchSummary, SceneResult, run_batch

__all__ = ["BatchSummary", "SceneResult", "run_batch"]
