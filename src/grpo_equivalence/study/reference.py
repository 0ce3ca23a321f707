"""The configuration reference (docs/configuration.md), generated from the study's schema so that it cannot drift
from what the workflow checks: `python -m grpo_equivalence.study.reference docs/configuration.md` (`make docs`);
tests/test_docs.py fails when the committed page is not what the schema gives."""

import json
import sys
from pathlib import Path

import yaml

from ..runtime.paths import PROJECT, SCHEMA

HEADER = """# Configuration reference

Every key of a study file, as `{schema}` defines it. The workflow checks a study against it
before any job: unknown keys are refused, and each problem is named with its fix. This page is generated from
the schema by `make docs`; do not edit it by hand.
"""


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _kind(spec: dict) -> str:
    """What a value must be, in words: its type (or choices), the items of a list, and its bounds."""
    if "enum" in spec:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    types = spec.get("type", "any")
    types = [types] if isinstance(types, str) else list(types)
    words = []
    for kind in types:
        if kind == "array":
            item = spec.get("items", {}).get("type")
            words.append(f"list of {item}s" if item else "list")
        elif kind == "object":
            words.append("mapping")
        else:
            words.append(kind)
    bounds = [f"{word} {spec[key]}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                      ("maximum", "<="), ("multipleOf", "multiple of"))
              if key in spec]
    if "minItems" in spec:
        bounds.append(f"at least {spec['minItems']} item{'s' if spec['minItems'] > 1 else ''}")
    return " or ".join(words) + (f" ({', '.join(bounds)})" if bounds else "")


def _rows(properties: dict, required: list, prefix: str = "") -> list[str]:
    rows = []
    for name, spec in properties.items():
        key = f"{prefix}{name}"
        need = "required" if name in required else (
            f"default `{json.dumps(spec['default'])}`" if "default" in spec and not isinstance(spec["default"], dict)
            else "optional")
        rows.append(f"| `{key}` | {_kind(spec)} | {need} | {_cell(spec.get('description', ''))} |")
        if isinstance(spec.get("properties"), dict):
            rows += _rows(spec["properties"], spec.get("required", []), f"{key}.")
        if isinstance(spec.get("additionalProperties"), dict):
            rows.append(f"| `{key}.NAME` | {_kind(spec['additionalProperties'])} | optional | "
                        f"{_cell(spec['additionalProperties'].get('description', 'An entry under any name.'))} |")
    return rows


def render(schema_path: Path = SCHEMA) -> str:
    schema = yaml.safe_load(Path(schema_path).read_text())
    rows = ["| Key | Value | Required or default | What it sets |", "| --- | --- | --- | --- |"]
    rows += _rows(schema["properties"], schema.get("required", []))
    where = Path(schema_path).resolve()
    where = where.relative_to(PROJECT) if where.is_relative_to(PROJECT) else where
    return "\n".join([HEADER.format(schema=where), _cell(schema.get("description", "")), "", *rows]) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m grpo_equivalence.study.reference OUTPUT.md (e.g. docs/configuration.md)")
    Path(argv[0]).write_text(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
