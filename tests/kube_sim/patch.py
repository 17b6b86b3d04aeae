"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on plain dicts."""

from __future__ import annotations

import copy
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch; null deletes a key, lists are replaced whole.

    Strategic merge patches are applied this way too: the simulated server does not know the
    per-field merge keys, so a list in a strategic patch replaces the list it names.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives such as $patch, $retainKeys
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    if not pointer.startswith("/"):
        raise ValueError(f"invalid JSON pointer {pointer!r}")
    tokens = [_unescape(t) for t in pointer[1:].split("/")]
    node = doc
    for token in tokens[:-1]:
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node, tokens[-1]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply RFC 6902 add/remove/replace/test/copy/move; ValueError on a failed op."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        try:
            if kind in ("copy", "move"):
                src, stoken = _parent(doc, op["from"])
                value = src[int(stoken)] if isinstance(src, list) else src[stoken]
                if kind == "move":
                    json_patch_remove(src, stoken)
                op = {"op": "add", "path": path, "value": copy.deepcopy(value)}
                kind = "add"
            parent, token = _parent(doc, path)
            if kind == "add":
                if isinstance(parent, list):
                    idx = len(parent) if token == "-" else int(token)
                    parent.insert(idx, op["value"])
                else:
                    parent[token] = op["value"]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(token)] = op["value"]
                else:
                    if token not in parent:
                        raise KeyError(token)
                    parent[token] = op["value"]
            elif kind == "remove":
                json_patch_remove(parent, token)
            elif kind == "test":
                actual = parent[int(token)] if isinstance(parent, list) else parent[token]
                if actual != op["value"]:
                    raise ValueError(f"test failed at {path}")
            else:
                raise ValueError(f"unsupported op {kind!r}")
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"{kind} {path}: {e}") from e
    return doc


def json_patch_remove(parent: Any, token: str) -> None:
    if isinstance(parent, list):
        del parent[int(token)]
    else:
        del parent[token]
