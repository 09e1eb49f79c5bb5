"""The base of every spec model, and the CEL rules the CRD schema carries."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

#: the longest experiment name whose children (`<name>-treatment`, ...) are still DNS labels
MAX_NAME_LENGTH = 53


class Model(BaseModel):
    """Base of every spec model: frozen, no unknown fields, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


def cel(rule: str, message: str) -> dict[str, Any]:
    """One `x-kubernetes-validations` entry, for `json_schema_extra`."""
    return {"rule": rule, "message": message}


def cel_extra(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}
