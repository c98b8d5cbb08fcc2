"""JSON Schema export: one file per event type plus the union, generated from the models."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ingest.events import EVENT_ADAPTER, EVENT_CLASSES, EVENT_TYPES, SCHEMA_VERSION
from ingest.schema_export import (
    JSON_SCHEMA_DIALECT,
    SCHEMA_VERSION_KEY,
    UNION_FILE,
    event_schema,
    export_schemas,
    schema_id,
)
from tests.ingest.event_samples import sample_event

ADDED_KEYS = {"$schema", "$id", SCHEMA_VERSION_KEY}
HAVE_JSONSCHEMA = importlib.util.find_spec("jsonschema") is not None


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("schemas")
    paths = export_schemas(directory)
    assert sorted(paths) == sorted(directory.iterdir())
    return {path.name: json.loads(path.read_text(encoding="utf-8")) for path in paths}


def test_one_file_per_event_type_and_one_for_the_union(exported: dict[str, dict[str, Any]]) -> None:
    assert set(exported) == {f"{name}.schema.json" for name in EVENT_TYPES} | {UNION_FILE}


@pytest.mark.parametrize("name", [*EVENT_TYPES, None])
def test_each_schema_is_the_models_own_schema_plus_metadata(
    exported: dict[str, dict[str, Any]], name: str | None
) -> None:
    schema = exported[f"{name}.schema.json" if name else UNION_FILE]
    assert schema == event_schema(name)
    assert schema["$schema"] == JSON_SCHEMA_DIALECT
    assert schema["$id"] == schema_id(name or "event")
    assert schema[SCHEMA_VERSION_KEY] == SCHEMA_VERSION
    assert schema["title"]
    # Single source of truth: apart from the metadata, the file is what pydantic generates.
    generated = EVENT_CLASSES[name].model_json_schema() if name else EVENT_ADAPTER.json_schema()
    assert {key: value for key, value in schema.items() if key in generated} == generated
    assert set(schema) - set(generated) <= ADDED_KEYS | {"title", "description"}


def test_type_is_required_and_fixed(exported: dict[str, dict[str, Any]]) -> None:
    for name in EVENT_TYPES:
        schema = exported[f"{name}.schema.json"]
        assert "type" in schema["required"]
        assert schema["properties"]["type"]["const"] == name
        assert schema["additionalProperties"] is False


def test_free_text_fields_are_marked_for_redaction(exported: dict[str, dict[str, Any]]) -> None:
    text = json.dumps(exported["generation.schema.json"])
    assert text.count('"x-liveloop-redacted": true') == 4  # prompt, completion, tool arguments, segment text


def test_output_is_deterministic(tmp_path: Path) -> None:
    first = {path.name: path.read_bytes() for path in export_schemas(tmp_path / "a")}
    second = {path.name: path.read_bytes() for path in export_schemas(tmp_path / "b")}
    assert first == second
    for raw in first.values():
        assert raw.endswith(b"}\n")
        assert raw.decode() == json.dumps(json.loads(raw), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _conforms(instance: Any, schema: dict[str, Any], root: dict[str, Any]) -> bool:
    """A small JSON Schema checker for the keywords pydantic emits, used when jsonschema is absent."""
    if "$ref" in schema:
        return _conforms(instance, root["$defs"][schema["$ref"].removeprefix("#/$defs/")], root)
    if "anyOf" in schema:
        return any(_conforms(instance, option, root) for option in schema["anyOf"])
    if "oneOf" in schema:
        return sum(_conforms(instance, option, root) for option in schema["oneOf"]) == 1
    if "const" in schema and instance != schema["const"]:
        return False
    if "enum" in schema and instance not in schema["enum"]:
        return False
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    kind = schema.get("type")
    if kind in kinds and not isinstance(instance, kinds[kind]):
        return False
    if kind in ("integer", "number") and (isinstance(instance, bool) or not isinstance(instance, int | float)):
        return False
    if kind == "integer" and not isinstance(instance, int):
        return False
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        if not set(schema.get("required", [])) <= set(instance):
            return False
        if schema.get("additionalProperties") is False and not set(instance) <= set(properties):
            return False
        return all(_conforms(value, properties[key], root) for key, value in instance.items() if key in properties)
    if isinstance(instance, list):
        return len(instance) <= schema.get("maxItems", len(instance)) and all(
            _conforms(item, schema.get("items", {}), root) for item in instance
        )
    if isinstance(instance, str):
        pattern = schema.get("pattern")
        return len(instance) <= schema.get("maxLength", len(instance)) and (
            pattern is None or re.search(pattern, instance) is not None
        )
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        return bool(schema.get("minimum", instance) <= instance <= schema.get("maximum", instance))
    return True


def _validates(instance: Any, schema: dict[str, Any]) -> bool:
    if HAVE_JSONSCHEMA:
        jsonschema = importlib.import_module("jsonschema")  # optional: used only where installed
        return bool(jsonschema.Draft202012Validator(schema).is_valid(instance))
    return _conforms(instance, schema, schema)


@pytest.mark.parametrize("name", EVENT_TYPES)
def test_each_schema_accepts_a_sample_of_its_type(exported: dict[str, dict[str, Any]], name: str) -> None:
    sample = sample_event(name)
    assert _validates(sample, exported[f"{name}.schema.json"])
    assert _validates(sample, exported[UNION_FILE])


@pytest.mark.parametrize("name", EVENT_TYPES)
def test_each_schema_rejects_what_the_model_rejects(exported: dict[str, dict[str, Any]], name: str) -> None:
    schema = exported[f"{name}.schema.json"]
    extra = sample_event(name) | {"colour": "blue"}
    missing = sample_event(name)
    del missing["session_id"]
    wrong_type = sample_event(name) | {"privacy_mode": "no"}
    other_type = sample_event(name) | {"type": next(other for other in EVENT_TYPES if other != name)}
    for bad in (extra, missing, wrong_type, other_type):
        assert not _validates(bad, schema)
