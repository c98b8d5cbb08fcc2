"""Export the event contract as JSON Schema files, for producers that do not use Python.

The schemas are generated from the pydantic models in :mod:`ingest.events`, the single source of
truth; nothing here describes a field by hand. Run ``python -m ingest.schema_export DIRECTORY``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ingest.events import EVENT_ADAPTER, EVENT_CLASSES, SCHEMA_VERSION

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_VERSION_KEY = "x-liveloop-schema-version"
UNION_FILE = "event.schema.json"


def schema_id(name: str) -> str:
    """The ``$id`` of the schema of event type ``name`` (``"event"`` for the union of all types)."""
    return f"urn:liveloop:events:v{SCHEMA_VERSION}:{name}"


def event_schema(name: str | None = None) -> dict[str, Any]:
    """The JSON Schema of event type ``name``, or of any event when ``name`` is None.

    It is the model's own schema plus ``$schema``, ``$id``, a title (for the union) and the event
    schema version under ``x-liveloop-schema-version``.
    """
    if name is None:
        schema = EVENT_ADAPTER.json_schema()
        schema.setdefault("title", "Event")
        schema.setdefault("description", "Any liveloop event; the 'type' field selects the shape.")
    else:
        schema = EVENT_CLASSES[name].model_json_schema()
    # $id and $schema only at the top: an $id inside $defs would change how "#/$defs/..." resolves.
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": schema_id(name or "event"),
        SCHEMA_VERSION_KEY: SCHEMA_VERSION,
        **schema,
    }


def export_schemas(directory: Path) -> list[Path]:
    """Write ``<type>.schema.json`` for every event type and ``event.schema.json``; return the paths.

    Output is deterministic (sorted keys, two-space indent, trailing newline), so the files can be
    committed and a change to the contract shows up as a diff.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, file_name in [*((name, f"{name}.schema.json") for name in EVENT_CLASSES), (None, UNION_FILE)]:
        path = directory / file_name
        text = json.dumps(event_schema(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    """Command line: write the schemas into the directory given."""
    parser = argparse.ArgumentParser(description="Write the liveloop event JSON Schemas.")
    parser.add_argument("directory", type=Path)
    for path in export_schemas(parser.parse_args(argv).directory):
        print(path)


if __name__ == "__main__":
    main()
