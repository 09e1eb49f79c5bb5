from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from specdecode.experiment import crd
from tests.factories import EXAMPLES, ROOT

CRD_FILE = ROOT / "crds" / "specdecodeexperiments.specdecode.io.yaml"


def root_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crd.render(), "crds/ is stale: run `make crd`"


def test_every_field_has_a_description() -> None:
    assert crd.missing_descriptions(root_schema()) == []


def test_descriptions_are_reflowed_docstrings() -> None:
    # `kubectl explain` shows a description as written: the docstrings' line wrapping must not show.
    wrapped = [
        path for path, node in walk(root_schema()) if "\n" in node.get("description", "").replace("\n\n", "")
    ]
    assert wrapped == []
    engine = root_schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    assert engine["offline"]["description"].startswith("Air-gapped: both arms get `HF_HUB_OFFLINE=1` and")


def test_a_model_used_by_two_fields_is_written_out_twice_not_aliased() -> None:
    # engine.apiKeySecret and engine.hfTokenSecret share SecretKeyRef; YAML anchors would hide one
    assert "&id" not in crd.render() and "*id" not in crd.render()


def test_names_status_subresource_and_printer_columns() -> None:
    body = crd.build_crd()
    assert body["metadata"]["name"] == "specdecodeexperiments.specdecode.io"
    assert body["spec"]["names"]["shortNames"] == ["sdx"]
    version = body["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Phase", "Verdict", "Speedup", "Age"} <= set(columns)


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, sub in node.get("properties", {}).items():
            out.extend(walk(sub, f"{path}.{key}"))
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                out.extend(walk(node[key], f"{path}[{key}]"))
    return out


def test_schema_is_structural() -> None:
    for path, node in walk(root_schema()):
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        extension = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or extension, f"{path} has no type"
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, path


def test_enums_ranges_and_cel_rules_are_in_the_schema() -> None:
    spec = root_schema()["properties"]["spec"]["properties"]
    speculative = spec["speculative"]
    assert "draft_model" in speculative["properties"]["method"]["enum"]
    assert speculative["properties"]["numSpeculativeTokens"] == {
        **speculative["properties"]["numSpeculativeTokens"],
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    rules = [rule["rule"] for rule in speculative["x-kubernetes-validations"]]
    assert any("promptLookupMin <= self.promptLookupMax" in rule for rule in rules)
    stage = spec["workload"]["properties"]["stages"]["items"]
    assert stage["x-kubernetes-validations"][0]["rule"] == "has(self.rate) != has(self.concurrency)"
    assert spec["workload"]["properties"]["stages"]["maxItems"] == 32  # bounds the CEL uniqueness rule's cost
    assert root_schema()["x-kubernetes-validations"][0]["rule"] == "self.metadata.name.size() <= 53"


def as_json_schema(node: Any) -> Any:
    """OpenAPI v3 (nullable, boolean exclusive bounds) -> JSON Schema, to check documents offline."""
    if isinstance(node, list):
        return [as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"
    }
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if out.get(bound) is True:
            out[bound] = out.pop(plain)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_satisfy_the_crd_schema(example: Any) -> None:
    schema = as_json_schema(root_schema())
    schema["properties"]["metadata"] = {"type": "object"}
    for document in yaml.safe_load_all(example.read_text()):
        jsonschema.validate(document, schema)


def test_a_bad_document_fails_the_crd_schema() -> None:
    schema = as_json_schema(root_schema())
    document = yaml.safe_load(EXAMPLES[0].read_text())
    document["spec"]["speculative"]["numSpeculativeTokens"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


def test_end_to_end_latency_fields_are_e2e_on_the_wire_and_the_old_spelling_is_still_read() -> None:
    """v1alpha1 wrote `e2EP50` (the camel-casing of `e2e_p50`); the API now says `e2eP50`, in the CRD too."""
    from specdecode.experiment.status import ArmSummary

    assert ArmSummary(e2e_p50=1.0, e2e_p90=2.0, e2e_p99=3.0).wire() == {
        "requests": 0,
        "errors": 0,
        "e2eP50": 1.0,
        "e2eP90": 2.0,
        "e2eP99": 3.0,
    }
    assert ArmSummary.model_validate({"e2EP50": 4.0, "e2eP90": 5.0}).e2e_p50 == 4.0
    crd_text = (ROOT / "crds/specdecodeexperiments.specdecode.io.yaml").read_text()
    assert "e2eP50:" in crd_text and "e2EP" not in crd_text


class _Yaml11Loader(yaml.SafeLoader):
    """Reads y/Y/n/N as booleans, as YAML 1.1 and go-yaml v2 (kubectl's sigs.k8s.io/yaml) do."""

    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}  # noqa: RUF012


_Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", crd.YAML11_BOOL, list("yYnNtTfFoO"))


def test_the_crd_reads_the_same_under_yaml_1_1_where_n_is_false() -> None:
    # The speed-up's property `n` written plainly would reach the API server as the key `false`.
    assert yaml.load(CRD_FILE.read_text(), Loader=_Yaml11Loader) == crd.build_crd()
    assert "'n':" in CRD_FILE.read_text()
