"""Text made from the schema, so that no default or description is written twice:
``hub_config/defaults.yaml`` (descriptions become comments) and the README's configuration
reference (a table per section). Tests keep both files equal to what this makes.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from .schema import defaults, format_path, is_map, is_section, schema
from .validate import describe

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS_FILE = ROOT / "hub_config" / "defaults.yaml"
README = ROOT / "README.md"
HELM_SCHEMA_FILE = ROOT / "helm" / "gputap" / "values.schema.json"
HELM_SCHEMA_COMMAND = (
    "python -m gputap_common.settings helm-schema > helm/gputap/values.schema.json"
)
DEFAULTS_COMMAND = "python -m gputap_common.settings defaults > hub_config/defaults.yaml"
REFERENCE_COMMAND = "python -m gputap_common.settings reference --write README.md"
START = "<!-- settings-reference:start -->"
END = "<!-- settings-reference:end -->"
WIDTH = 100

_HEADER = f"""\
# gputap's settings at their defaults. Generated from gputap_common/settings/schema.yaml by
#   {DEFAULTS_COMMAND}
# so edit the schema, not this file; gputap reads its defaults from the schema.
#
# Copy the keys you want to change into your own YAML file and point GPUTAP_SETTINGS at it, or
# override single keys with GPUTAP__SECTION__KEY=value (the value is read as YAML). A key gputap
# does not know stops it, naming the nearest one it does."""


def defaults_yaml() -> str:
    """The text of ``hub_config/defaults.yaml``."""
    lines = _HEADER.splitlines()
    values = defaults()
    for key, node in schema()["properties"].items():
        lines.append("")
        lines += _yaml_entry(key, node, values[key], "")
    return "\n".join(lines) + "\n"


_NAME = {"type": "string", "minLength": 1}
#: the chart's ``billing:`` values (helm/gputap/templates/billing/): how billing's own
#: Deployment runs; its settings stay in ``jupyterhub.custom.gputap.billing``
BILLING_VALUES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Billing's Deployment (its settings are jupyterhub.custom.gputap.billing).",
    "properties": {
        "image": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "name": _NAME,
                "tag": {"type": "string", "description": "empty: the chart's appVersion"},
                "pullPolicy": {"enum": ["", "IfNotPresent", "Always", "Never"]},
            },
        },
        "replicas": {
            "type": "integer",
            "minimum": 1,
            "description": "more than 1 needs PostgreSQL (database.urlSecret)",
        },
        "resources": {"type": "object"},
        "database": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "urlSecret": {
                    "description": "PostgreSQL: the Secret and key holding billing's "
                    "database URL; null: SQLite on a PersistentVolumeClaim",
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name", "key"],
                            "properties": {"name": _NAME, "key": _NAME},
                        },
                    ],
                },
                "sqlite": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "size": _NAME,
                        "storageClassName": {"type": "string"},
                    },
                },
            },
        },
    },
}


#: the chart's ``rbac`` key (templates/rbac/)
RBAC_VALUES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "gputap's own ServiceAccount, Roles and bindings (docs/kubernetes.md, RBAC).",
    "properties": {
        "create": {
            "type": "boolean",
            "default": True,
            "description": "false: you grant what docs/kubernetes.md lists yourself.",
        }
    },
}


def _priority_class(
    what: str, value: int, value_help: str, policy: str, policy_help: str
) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": f"The PriorityClass of {what} servers.",
        "properties": {
            "value": {"type": "integer", "default": value, "description": value_help},
            "preemptionPolicy": {
                "type": "string",
                "enum": ["PreemptLowerPriority", "Never"],
                "default": policy,
                "description": policy_help,
            },
        },
    }


#: the chart's ``priorityClasses`` key (templates/priorityclasses.yaml); their names are
#: gputap's settings (spawner.kubernetes.priority_classes), which the hub reads too
PRIORITY_CLASS_VALUES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "The cluster-scoped PriorityClasses the chart creates for servers.",
    "properties": {
        "create": {
            "type": "boolean",
            "default": True,
            "description": "false: the classes named in custom.gputap exist already.",
        },
        "onDemand": _priority_class(
            "on-demand",
            1000,
            "Its priority: on-demand above spot, so it preempts spot.",
            "PreemptLowerPriority",
            "PreemptLowerPriority: an on-demand server may preempt spot servers.",
        ),
        # cluster-autoscaler counts pods below --expendable-pods-priority-cutoff (default
        # -10) as expendable: docs/kubernetes.md, "Priority classes"
        "spot": _priority_class(
            "interruptible (spot)",
            -10,
            "Its priority: below on-demand, so on-demand preempts spot, and not below "
            "cluster-autoscaler's --expendable-pods-priority-cutoff (default -10), under "
            "which the autoscaler removes a node running only spot servers as if it were "
            "empty.",
            "Never",
            "Never: a spot server takes only what is free and never preempts another pod.",
        ),
    },
}


def helm_values_schema() -> dict[str, Any]:
    """The Helm chart's ``values.schema.json``: gputap's schema, strict, at
    ``jupyterhub.custom.gputap``; the rest of ``jupyterhub`` is left to zero-to-jupyterhub's
    own schema, which Helm applies to the subchart's values."""
    gputap = {key: value for key, value in schema().items() if key != "$schema"}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": f"Generated from gputap_common/settings/schema.yaml: {HELM_SCHEMA_COMMAND}",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "global": {"type": "object"},
            "billing": BILLING_VALUES,
            "rbac": RBAC_VALUES,
            "priorityClasses": PRIORITY_CLASS_VALUES,
            "jupyterhub": {
                "type": "object",
                "properties": {
                    "custom": {
                        "type": "object",
                        "properties": {"gputap": gputap},
                    }
                },
            },
        },
    }


def helm_values_schema_json() -> str:
    """The text of ``helm/gputap/values.schema.json``."""
    return json.dumps(helm_values_schema(), indent=2) + "\n"


def _yaml_entry(key: str, node: Mapping[str, Any], value: Any, pad: str) -> list[str]:
    lines = _comment(str(node.get("description", "")), pad)
    if is_section(node):
        lines.append(f"{pad}{key}:")
        after_section = False
        for child_key, child in node["properties"].items():
            if is_section(child) or after_section:
                lines.append("")
            lines += _yaml_entry(child_key, child, value[child_key], pad + "  ")
            after_section = is_section(child)
    elif isinstance(value, dict) and value:
        lines.append(f"{pad}{key}:")
        for k, v in value.items():
            line = f"{pad}  {_flow(k)}: {_flow(v)}"
            if isinstance(v, dict) and len(line) > WIDTH:  # a long entry, one key a line
                lines.append(f"{pad}  {_flow(k)}:")
                lines += [f"{pad}    {_flow(k2)}: {_flow(v2)}" for k2, v2 in v.items()]
            else:
                lines.append(line)
    else:
        lines.append(f"{pad}{key}: {_flow(value)}")
    return lines


def _comment(text: str, pad: str) -> list[str]:
    width = WIDTH - len(pad) - 2
    wrapped = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    return [f"{pad}# {line}" for line in wrapped]


def _flow(value: Any) -> str:
    """``value`` as one line of YAML that reads back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def reference_markdown() -> str:
    """The README's configuration reference, markers included."""
    root = schema()
    lines = [
        START,
        f"<!-- generated from gputap_common/settings/schema.yaml by `{REFERENCE_COMMAND}`; "
        "edit the schema, not this -->",
        "",
    ]
    top = {key: node for key, node in root["properties"].items() if not is_section(node)}
    lines += _table(_rows("", {"properties": top}))
    for key, node in root["properties"].items():
        if is_section(node):
            lines += _section((key,), node, "###")
    lines.append(END)
    return "\n".join(lines)


def with_reference(readme: str) -> str:
    """``readme`` with the text between the markers replaced by the current reference."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {START} ... {END} markers to write the reference in")
    return readme[:start] + reference_markdown() + readme[end + len(END) :]


def _section(path: tuple[str, ...], node: Mapping[str, Any], heading: str) -> list[str]:
    lines = ["", f"{heading} `{format_path(path)}`", ""]
    if node.get("description"):
        lines += [_markdown(str(node["description"])), ""]
    lines += _table(_rows(format_path(path), node))
    for key, child in node["properties"].items():
        if is_section(child):
            lines += _section((*path, key), child, heading + "#")
    return lines


def _rows(prefix: str, node: Mapping[str, Any], inside: bool = False) -> Iterator[list[str]]:
    """Table rows of a section's values, with the keys inside its lists' items and its maps'
    values after the list or map (``hub.services[].name``, ``catalog.cards.*.name``), and
    there (``inside``) the keys of their sections too (``environments.*.needs.gpu``)."""
    required = set(node.get("required", []))
    for key, child in node["properties"].items():
        name = f"{prefix}.{key}" if prefix else key
        if is_section(child):
            if inside:
                yield from _rows(name, child, inside)
            continue
        if "default" in child:
            default = f"`{_flow(child['default'])}`"
        else:
            default = "required" if key in required else ""
        type_text = re.sub(r"^an? ", "", describe(child))
        description = _markdown(str(child.get("description", "")))
        yield [f"`{name}`", _markdown(type_text), default, description]
        if is_map(child) and is_section(child["additionalProperties"]):
            yield from _rows(f"{name}.*", child["additionalProperties"], inside=True)
        elif is_section(child.get("items", {})):
            yield from _rows(f"{name}[]", child["items"], inside=True)


def _table(rows: Iterator[list[str]]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines if len(lines) > 2 else []


def _markdown(text: str) -> str:
    """Plain text for a Markdown cell: a < outside `code` starts no HTML tag."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)
