"""Parsing a user's YAML (policy, fleet, kubeconfig, pod, trace files) strictly, with one-line errors.

PyYAML's ``safe_load`` keeps the last of two equal keys in a mapping (``thermal: {weight: 1, weight: 50}`` loads 50)
and recurses once per nesting level (a file nested 10,000 deep raises :class:`RecursionError`). :func:`safe_load` and
:func:`safe_load_all` refuse both as :class:`yaml.YAMLError` (a ``MarkedYAMLError`` carrying the line), so that every
caller's ``except yaml.YAMLError`` reports them; :func:`describe` makes any YAML error one line naming the line and
column.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

#: Deeper nesting than any real policy, fleet, kubeconfig or pod file (a Pod is ~10 levels deep).
MAX_DEPTH = 100

_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate mapping keys and nesting deeper than :data:`MAX_DEPTH`."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # `<<: *base`: keys merged in may be overridden, as YAML means
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: the base constructor names it
                    continue
                if seen:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first set on line {first_line[key] + 1}); a key may appear once "
                        "in a mapping",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def safe_load(text: str | bytes) -> Any:
    """The one document of ``text`` (None when empty). Raises :class:`yaml.YAMLError`, duplicates included."""
    return yaml.load(text, Loader=StrictLoader)


def safe_load_all(text: str | bytes) -> Iterator[Any]:
    """Every document of ``text``, as :func:`yaml.safe_load_all`, with :class:`StrictLoader`'s checks."""
    return yaml.load_all(text, Loader=StrictLoader)


def describe(exc: yaml.YAMLError) -> str:
    """One line: ``line 3, column 5: duplicate key 'weight' (...)``, or PyYAML's own text made one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f"{exc.context} " if exc.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {context}{exc.problem}"
    return " ".join(str(exc).split())
