"""Frozen dataclass configs built from ml_collections ConfigDicts: the one ``from_config``.

``TransformerConfig``, ``TrainConfig`` and every other config dataclass inherit
``ConfigFields``: ``from_config`` takes a ConfigDict or a dict and refuses fields
the dataclass does not have (a misspelled override is an error, never ignored);
``replace`` returns a changed copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

_Config = TypeVar("_Config", bound="ConfigFields")


def is_int(value: Any) -> bool:
  """Whether ``value`` is a whole number as a count or an id must be: a Python or numpy int,
  not a bool, not a float (2.5 would pass a range check and fail while tracing, or be cut)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
  """Whether ``value`` is a number a rate or a coefficient may be: a Python or numpy int or
  float, not a bool (NaN and inf pass; ranges are checked by the caller)."""
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
    value, (bool, np.bool_)
  )


class ConfigFields:
  """Mixin for frozen dataclasses: ``from_config`` with an unknown-field check, ``replace``."""

  @classmethod
  def _flatten(cls, values: dict[str, Any]) -> dict[str, Any]:
    """Hook: map nested config sections to fields (e.g. ``distill.mode`` -> ``distill_mode``)."""
    return values

  @classmethod
  def from_config(cls: type[_Config], config: Mapping[str, Any]) -> _Config:
    """Builds from a ConfigDict (or dict); unknown fields are an error, not ignored."""
    values = cls._flatten(dict(config.to_dict() if hasattr(config, "to_dict") else config))
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"Unknown {cls.__name__} fields {unknown}; known fields: {sorted(known)}.")
    return cls(**values)

  def replace(self: _Config, **changes: Any) -> _Config:
    return dataclasses.replace(self, **changes)
