"""The CustomResourceDefinition, generated from the typed models (`python -m specdecode.experiment.crd`).

Pydantic emits JSON Schema (draft 2020-12); Kubernetes wants a *structural* OpenAPI v3 schema. The
translation, in one place:
- `$ref`s are inlined (structural schemas have no references);
- `X | None` becomes `X` with `nullable: true`;
- a discriminated union (the dataset) becomes one object holding every variant's fields, with the
  discriminator as an enum; per-variant rules are CEL rules that test `self.type`; a field two
  variants share with different enums takes the union of their values;
- numeric `exclusiveMinimum: n` becomes `minimum: n, exclusiveMinimum: true` (draft-4 style);
- int-or-string quantities and free-form maps use the Kubernetes extensions;
- only scalar defaults are kept, so the API server fills in what `kubectl get -o yaml` should show.

`make crd` regenerates `crds/specdecodeexperiments.specdecode.io.yaml`; a test fails when it is stale.
"""

from __future__ import annotations

import copy
import re
import sys
from typing import Any

import yaml

from specdecode.experiment import keys, spec, status

_DROP = {"title", "discriminator"}

PRINTER_COLUMNS = [
    {
        "name": "Phase",
        "type": "string",
        "jsonPath": ".status.phase",
        "description": "Where the experiment is.",
    },
    {
        "name": "Verdict",
        "type": "string",
        "jsonPath": ".status.verdict",
        "description": "Promote, Reject or Inconclusive (when Completed).",
    },
    {
        "name": "Speedup",
        "type": "string",
        "jsonPath": ".status.speedupSummary",
        "description": "Primary-metric speed-up per stage.",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": ".status.reason",
        "priority": 1,
        "description": "Machine reason of the phase or verdict.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _convert(raw, definitions)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        # a copy: a model used by two fields must not share lists with the other (YAML would alias them)
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        merged = _convert(target, defs)
        if "description" in node:  # the field's own description wins over the model's docstring
            merged["description"] = node["description"]
        for key, value in node.items():
            if key.startswith("x-kubernetes") or key == "default":
                merged[key] = value
        return _finish(merged)
    if node.get("x-kubernetes-int-or-string"):
        return _finish({k: v for k, v in node.items() if k not in ("anyOf", "type")})
    if node.get("x-kubernetes-preserve-unknown-fields"):
        kept = {k: v for k, v in node.items() if k in ("description", "x-kubernetes-preserve-unknown-fields")}
        if node.get("type") == "object" or node.get("additionalProperties") is not None:
            kept["type"] = "object"
        return kept
    variants = node.pop("anyOf", None) or node.pop("oneOf", None)
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        base = (
            _merge_variants([_convert(v, defs) for v in non_null], defs)
            if len(non_null) > 1
            else (_convert(non_null[0], defs))
        )
        for key, value in node.items():
            if key not in _DROP:
                base[key] = value
        if len(non_null) < len(variants):
            base["nullable"] = True
        return _finish(base)
    if "properties" in node:
        node["properties"] = {name: _convert(sub, defs) for name, sub in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _convert(node["additionalProperties"], defs)
    if isinstance(node.get("items"), dict):
        node["items"] = _convert(node["items"], defs)
    if "prefixItems" in node:  # fixed-length tuples: a list of one common type
        node.pop("prefixItems")
        node["items"] = {"type": "integer"}
    return _finish(node)


def _merge_variants(variants: list[dict[str, Any]], defs: dict[str, Any]) -> dict[str, Any]:
    """One object holding every variant's properties (a discriminated union, structurally)."""
    if not all(v.get("type") == "object" for v in variants):
        raise ValueError(f"cannot express a union of {[v.get('type') for v in variants]} structurally")
    properties: dict[str, Any] = {}
    rules: list[dict[str, Any]] = []
    tags: list[str] = []
    for variant in variants:
        for name, sub in variant.get("properties", {}).items():
            if name == "type" and "enum" in sub:
                tags.extend(t for t in sub["enum"] if t not in tags)
                continue
            # no defaults inside a union: the API server would add one variant's fields to another's
            sub = {k: v for k, v in sub.items() if k != "default"}
            known = properties.setdefault(name, sub)
            if known is not sub and "enum" in known and "enum" in sub:
                # the same field with its own values in two variants (`builtin` of a trace and of
                # multi-turn sessions): either variant's values; the Python models hold each to its own
                tag = variant.get("properties", {}).get("type", {}).get("enum", ["?"])[0]
                known["enum"] = [*known["enum"], *(v for v in sub["enum"] if v not in known["enum"])]
                known["description"] = (
                    f"{known.get('description', '')} With {tag}: {sub.get('description', '')}"
                )
        rules.extend(variant.get("x-kubernetes-validations", []))
    properties["type"] = {
        "type": "string",
        "enum": tags,
        "description": "Which kind: " + ", ".join(tags) + ".",
    }
    merged: dict[str, Any] = {"type": "object", "properties": properties, "required": ["type"]}
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def _finish(node: dict[str, Any]) -> dict[str, Any]:
    for key in _DROP:
        node.pop(key, None)
    if isinstance(node.get("description"), str):
        node["description"] = reflow(node["description"])
    if node.get("additionalProperties") is False:  # structural schemas forbid it; unknown fields are pruned
        node.pop("additionalProperties")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if "default" in node and (node["default"] is None or isinstance(node["default"], dict | list)):
        node.pop("default")
    if node.get("type") == "number" and isinstance(node.get("default"), int):
        node["default"] = float(node["default"])
    return node


def reflow(docstring: str) -> str:
    """A docstring as a description: the source's line breaks joined, paragraphs kept."""
    paragraphs = docstring.strip().split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def missing_descriptions(schema: dict[str, Any], path: str = "") -> list[str]:
    """Field paths without a description (the CRD must document every field)."""
    missing = []
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}"
        if here == ".metadata":  # the API server forbids documenting it
            continue
        if not sub.get("description"):
            missing.append(here)
        missing.extend(missing_descriptions(sub, here))
        if isinstance(sub.get("items"), dict):
            missing.extend(missing_descriptions(sub["items"], here + "[]"))
    return missing


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec_schema = openapi_schema(spec.ExperimentSpec)
    status_schema = openapi_schema(status.ExperimentStatus)
    root = {
        "type": "object",
        "description": "An experiment that measures whether vLLM speculative decoding makes a model faster.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            # The API server refuses anything but `type` here (name/generateName rules are its own).
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {spec.MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {spec.MAX_NAME_LENGTH} characters so that the arms' "
                "names (<name>-treatment) stay DNS labels",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{keys.PLURAL}.{keys.API_GROUP}"},
        "spec": {
            "group": keys.API_GROUP,
            "names": {
                "kind": keys.KIND,
                "listKind": f"{keys.KIND}List",
                "plural": keys.PLURAL,
                "singular": keys.KIND.lower(),
                "shortNames": [keys.SHORT_NAME],
                "categories": ["all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": keys.API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `make crd` from operator/specdecode/experiment/{spec,status}.py. Do not edit.\n"


YAML11_BOOL = re.compile(
    r"^(?:y|Y|n|N|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"
)
"""The plain scalars YAML 1.1 reads as booleans. PyYAML leaves out y/Y/n/N, but go-yaml v2 (under
kubectl's sigs.k8s.io/yaml) reads them: an unquoted property `n:` would be the key `false`."""


class _Dumper(yaml.SafeDumper):
    """Quotes every string YAML 1.1 would read as a boolean (the property `n` of a speed-up)."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:bool", YAML11_BOOL, list("yYnNtTfFoO"))


def render() -> str:
    """The CRD file's text."""
    return HEADER + yaml.dump(build_crd(), Dumper=_Dumper, sort_keys=False, width=110)


if __name__ == "__main__":
    sys.stdout.write(render())
