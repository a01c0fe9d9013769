"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``), PascalCase on the wire.

The pydantic models document and validate the format; the embedded Pod and Node objects stay plain API JSON
(camelCase dicts) and are never validated field by field: a 5,000-node request must not pay for that. The hot path
uses :func:`parse_args`, which decodes with msgspec (Node objects stay undecoded JSON text) and checks only the shape
kelvin relies on, and
:func:`filter_result` / :meth:`NodeNameList.priority_json` to build replies that :func:`dumps` serialises with orjson.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import orjson
from pydantic import BaseModel, ConfigDict, Field

from .errors import WireError, too_many_names

IntA = npt.NDArray[np.int64]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NodeList(_Wire):
    """``v1.NodeList``: ``{"metadata": {}, "items": [Node, ...]}``."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of ``filter`` and ``prioritize``. ``Nodes`` when nodeCacheCapable is false, else ``NodeNames``."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=0, le=10)


class ExtenderBindingArgs(_Wire):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(_Wire):
    Error: str = ""


class ExplainArgs(_Wire):
    """Body of kelvin's own ``/explain``: a pod (API JSON) and the node to explain it on."""

    pod: dict[str, Any]
    node: str = Field(min_length=1)
    candidates: list[str] | None = None
    """Nodes the node competed with (scores are normalised among them); default: every node in the snapshot."""


class NodeNameList:
    """One request's candidate node names, duplicates dropped (the first one kept), with what the verbs derive from
    them: their rows in a snapshot (:meth:`rows`) and the ``HostPriorityList`` reply (:meth:`priority_json`).

    kube-scheduler sends the same list again and again (every node that passed its own filters, for pod after pod),
    so a :class:`NameCache` keeps the lists it decoded by their JSON text, and each list keeps its rows for the
    last snapshot index it was looked up in: a repeated list is neither decoded, nor checked, nor looked up again.
    The names a filter passes are a list of their own (:meth:`passed`), derived from the request's: kube-scheduler
    sends exactly them, in that order, to prioritize next, which then finds them decoded, looked up and with the
    reply's template cut out of the filter list's. Read-only once built (``names`` and the arrays are shared by
    every request that sends the same text)."""

    __slots__ = ("_by_row_index", "_names_array", "_parent", "_replies", "_template", "names", "sent")

    def __init__(self, names: list[str], sent: int | None = None) -> None:
        self.names = names
        self.sent = len(names) if sent is None else sent
        """How many names the request listed (before duplicates were dropped): what ``max_node_names`` limits."""
        self._by_row_index: tuple[Mapping[str, int], IntA] | None = None
        self._names_array: npt.NDArray[np.object_] | None = None
        self._template: _Template | None = None
        self._parent: tuple[NodeNameList, IntA] | None = None
        """The list these names were cut from (:meth:`passed`) and their positions in it."""
        self._replies = 0

    def __len__(self) -> int:
        return len(self.names)

    def rows(self, index: Mapping[str, int]) -> IntA:
        """The row of each name in ``index`` (a snapshot's name -> row map), -1 for a name it does not hold.
        Remembered for the last index (a snapshot's ledger overlays share its index)."""
        hit = self._by_row_index
        if hit is not None and hit[0] is index:
            return hit[1]
        parent = self._parent
        if parent is not None and parent[0]._by_row_index is not None and parent[0]._by_row_index[0] is index:
            rows = parent[0]._by_row_index[1][parent[1]]
        else:
            try:  # the common case: every name known (a KeyError costs one retry)
                rows = np.fromiter(map(index.__getitem__, self.names), dtype=np.int64, count=len(self.names))
            except KeyError:
                rows = np.array([index.get(n, -1) for n in self.names], dtype=np.int64)
        rows.setflags(write=False)
        self._by_row_index = (index, rows)
        return rows

    def subset(self, positions: IntA) -> list[str]:
        """The names at ``positions`` (in that order)."""
        n = len(self.names)
        if positions.size == n and (n == 0 or (positions[0] == 0 and bool(np.all(np.diff(positions) == 1)))):
            return self.names  # every one, in order
        if self._names_array is None:
            arr = np.empty(len(self.names), dtype=object)
            arr[:] = self.names
            self._names_array = arr
        out: list[str] = self._names_array[positions].tolist()
        return out

    def passed(self, positions: IntA) -> NodeNameList:
        """The list of the names at ``positions`` (what a filter passes), which knows where it was cut from: its
        rows (:meth:`rows`) and its prioritize reply's template are taken from this list's, by numpy indexing,
        instead of being looked up and written name by name. Itself when ``positions`` is every name in order."""
        positions = np.asarray(positions, dtype=np.int64).view()  # a view: the caller's array stays writable
        names = self.subset(positions)
        if names is self.names:
            return self
        out = NodeNameList(names)
        positions.setflags(write=False)
        out._parent = (self, positions)
        return out

    def priority_json(self, scores: IntA) -> bytes:
        """The ``HostPriorityList`` JSON of these names with ``scores`` (integers 0..10, one per name, in order).

        Written into a template of the whole reply (:class:`_Template`: each score has a two-character slot,
        ``" 7"``, ``"10"``; JSON allows the blank), so a reply is one copy of the template and two vectorised writes
        instead of a dict per node. A list cut from another (:meth:`passed`) cuts its template out of that one's;
        any other list is answered with dicts for its first two replies (making a template costs a few replies'
        worth: a list seen once or twice never pays for it), and templated from the third one on."""
        scores = np.asarray(scores, dtype=np.int64)
        if scores.shape != (len(self.names),):
            raise ValueError(f"{scores.size} scores for {len(self.names)} names")
        if scores.size and (scores.min() < 0 or scores.max() > 10):
            raise ValueError(f"scores must lie in 0..10, not {int(scores.min())}..{int(scores.max())}")
        self._replies += 1
        if self._template is None:
            if self._parent is not None:
                parent, positions = self._parent
                self._template = parent._own_template().cut(positions)
            elif self._replies <= 2:
                return orjson.dumps([{"Host": n, "Score": s} for n, s in zip(self.names, scores.tolist(), strict=True)])
            else:
                self._template = _Template.of(self.names)
        return self._template.fill(scores)

    def _own_template(self) -> _Template:
        if self._template is None:
            self._template = _Template.of(self.names)
        return self._template


@dataclass(frozen=True, slots=True)
class _Template:
    """The items of a ``HostPriorityList`` reply, ``{"Host":"<name>","Score":  },`` one after the other (each with
    its comma), as bytes; ``starts`` and ``lengths`` locate each item, whose two-byte score slot ends 2 bytes
    before its end."""

    items: npt.NDArray[np.uint8]
    starts: IntA
    lengths: IntA

    @classmethod
    def of(cls, names: Sequence[str]) -> _Template:
        heads = [b'{"Host":' + orjson.dumps(n) + b',"Score":  },' for n in names]
        lengths = np.fromiter(map(len, heads), dtype=np.int64, count=len(heads))
        items = np.frombuffer(b"".join(heads), dtype=np.uint8)
        return cls(items, np.cumsum(lengths) - lengths, lengths)

    def cut(self, positions: IntA) -> _Template:
        """The template of the items at ``positions`` (in that order): one pass over the bytes, a mask of the kept
        items' bytes when ``positions`` ascend (a filter's passed names), else a gather."""
        lengths = self.lengths[positions]
        starts = np.cumsum(lengths) - lengths
        if positions.size < 2 or bool(np.all(positions[1:] > positions[:-1])):
            keep = np.zeros(self.lengths.size, dtype=np.bool_)
            keep[positions] = True
            return _Template(self.items[np.repeat(keep, self.lengths)], starts, lengths)
        at = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(self.starts[positions] - starts, lengths)
        return _Template(self.items[at], starts, lengths)

    def fill(self, scores: IntA) -> bytes:
        """The reply: ``[``, the items with their scores written in, ``]`` over the last item's comma."""
        out = np.empty(self.items.size + 1 + (self.items.size == 0), dtype=np.uint8)
        out[0] = ord("[")
        out[1 : self.items.size + 1] = self.items
        out[-1] = ord("]")
        slot = 1 + self.starts + self.lengths - 4
        out[slot] = np.where(scores >= 10, ord("1"), ord(" "))
        out[slot + 1] = ord("0") + scores % 10
        return out.tobytes()


class NameCache:
    """The :class:`NodeNameList` of recently seen ``NodeNames`` texts (LRU, at most ``size`` of them), so that a
    list kube-scheduler repeats is decoded and looked up once. Lists under ``min_names`` are not kept (they cost
    little to decode). The names filters passed (:meth:`put_passed`) are kept apart, the last ``passed_size`` of
    them, so that a new one each pod never pushes the repeated lists out. Thread-safe: big bodies are parsed in
    worker threads."""

    def __init__(self, size: int = 16, min_names: int = 64, passed_size: int = 8) -> None:
        self.size = size
        self.min_names = min_names
        self.passed_size = passed_size
        self._lists: OrderedDict[bytes, NodeNameList] = OrderedDict()
        self._passed: OrderedDict[bytes, NodeNameList] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._lists) + len(self._passed)

    def get(self, text: bytes) -> NodeNameList | None:
        with self._lock:
            hit = self._lists.get(text)
            if hit is not None:
                self._lists.move_to_end(text)
                return hit
            return self._passed.get(text)

    def put(self, text: bytes, names: NodeNameList) -> None:
        if names.sent < self.min_names:
            return
        with self._lock:
            self._lists[text] = names
            self._lists.move_to_end(text)
            while len(self._lists) > self.size:
                self._lists.popitem(last=False)

    def put_passed(self, names: NodeNameList) -> None:
        """Keep the names a filter passed under the JSON text kube-scheduler sends them in to prioritize next (Go's
        ``encoding/json``: compact, as orjson writes them; a name Go escapes otherwise, such as one with ``<``, is
        only a miss, decoded as any new list). A list kept already under the same text (the same names: a filter
        of the same shape passed the same nodes) stays, with the rows and the reply template it derived since."""
        if names.sent < self.min_names:
            return
        text = orjson.dumps(names.names)
        with self._lock:
            self._passed.setdefault(text, names)
            self._passed.move_to_end(text)
            while len(self._passed) > self.passed_size:
                self._passed.popitem(last=False)


@dataclass(frozen=True, slots=True)
class ParsedArgs:
    """What the hot path needs from :class:`ExtenderArgs`. Duplicate node names are dropped (the first one kept)."""

    pod: Mapping[str, Any]
    name_list: NodeNameList
    node_objects: list[orjson.Fragment] | None
    """The Node objects (nodeCacheCapable false), in ``names`` order, as the undecoded JSON text they arrived as
    (copied out of the body while it is parsed, off the event loop): kelvin reads only ``metadata.name`` and echoes
    the nodes that pass back to kube-scheduler verbatim (it reads only the returned ``Nodes``). ``None`` in names
    mode."""
    pod_text: bytes | None = None
    """The Pod's JSON text as it arrived (``pod`` decodes it): kube-scheduler sends the same Pod to filter and then to
    prioritize, so the extender parses each text into a request once (``extender.pod_requests``). ``None`` when the
    body was decoded another way (a body of an unexpected shape)."""

    @property
    def names(self) -> list[str]:
        return self.name_list.names

    @property
    def node_cache_capable(self) -> bool:
        return self.node_objects is None


class _NodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class _Meta(msgspec.Struct):
    name: Any = None


class _NodeHead(msgspec.Struct):
    metadata: _Meta | None = None


class _Args(msgspec.Struct):
    """``ExtenderArgs`` with each Node object left undecoded (they are most of a big body)."""

    Pod: msgspec.Raw = msgspec.Raw(b"null")
    """Decoded on its own (:data:`_POD`), so that its text is at hand (``ParsedArgs.pod_text``)."""
    Nodes: _NodeList | None = None
    NodeNames: msgspec.Raw = msgspec.Raw(b"null")
    """Left undecoded: a list seen before is not decoded again (:class:`NameCache`)."""


_ARGS = msgspec.json.Decoder(_Args)
_POD = msgspec.json.Decoder()
_NODE_HEAD = msgspec.json.Decoder(_NodeHead)


_TOO_DEEP = "request body is not valid JSON: nested too deeply (Kubernetes objects are a few dozen levels deep at most)"


def _loads(body: bytes, expected: str = "a JSON object with Pod and Nodes or NodeNames") -> Any:
    if not body:
        raise WireError(f"empty request body: expected {expected}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # pragma: no cover - orjson reports its depth limit as a JSONDecodeError
        raise WireError(_TOO_DEEP) from None


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _check_pod(pod: Any) -> None:
    if not isinstance(pod, dict):
        raise WireError(f"Pod: must be a Pod object, not {_type_name(pod)}")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise WireError("Pod.metadata.name: missing (the Pod must carry its metadata)")


def _other_shape(body: bytes) -> tuple[Any, Any, list[msgspec.Raw] | None]:
    """``(Pod, NodeNames, Nodes.items)`` of valid JSON that is not shaped like ExtenderArgs, decoded whole with
    orjson to name the problem (or, when NodeNames is given, to ignore an odd Nodes next to it as before)."""
    data = _loads(body)
    if not isinstance(data, dict):
        raise WireError(f"request body must be a JSON object (ExtenderArgs), not {_type_name(data)}")
    _check_pod(data.get("Pod"))
    names_raw = data.get("NodeNames")
    nodes_raw = data.get("Nodes")
    if names_raw is not None or nodes_raw is None:
        return data["Pod"], names_raw, None
    if not isinstance(nodes_raw, dict):
        raise WireError(f"Nodes: must be a NodeList object, not {_type_name(nodes_raw)}")
    items = nodes_raw.get("items")
    if not isinstance(items, list):
        raise WireError(f"Nodes.items: must be a list of Node objects, not {_type_name(items)}")
    return data["Pod"], None, [msgspec.Raw(orjson.dumps(nd)) for nd in items]


def _name_list(names_raw: Any, max_node_names: int | None) -> NodeNameList:
    """The decoded ``NodeNames`` value, checked: a list of strings, at most ``max_node_names`` of them."""
    if not isinstance(names_raw, list):
        raise WireError(f"NodeNames: must be a list of node names, not {_type_name(names_raw)}")
    if max_node_names is not None and len(names_raw) > max_node_names:
        raise too_many_names("NodeNames", len(names_raw), max_node_names)
    if not set(map(type, names_raw)) <= {str}:  # one C-level pass; JSON strings decode to exactly str
        i, n = next((i, n) for i, n in enumerate(names_raw) if not isinstance(n, str))
        raise WireError(f"NodeNames[{i}]: must be a string, not {_type_name(n)}")
    unique = list(dict.fromkeys(names_raw))
    return NodeNameList(unique if len(unique) < len(names_raw) else names_raw, len(names_raw))


def _cached_name_list(text: bytes, max_node_names: int | None, cache: NameCache | None) -> NodeNameList:
    """:func:`_name_list` of the ``NodeNames`` JSON ``text``, from ``cache`` when the same text came before."""
    hit = cache.get(text) if cache is not None else None
    if hit is None:
        try:  # the body's decode skipped over it (Raw): its strings are checked (UTF-8, escapes) only here
            decoded = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise WireError(f"request body is not valid JSON: {exc}") from None
        hit = _name_list(decoded, max_node_names)
        if cache is not None:
            cache.put(text, hit)
    elif max_node_names is not None and hit.sent > max_node_names:
        raise too_many_names("NodeNames", hit.sent, max_node_names)
    return hit


def parse_args(body: bytes, *, max_node_names: int | None = None, names: NameCache | None = None) -> ParsedArgs:  # noqa: C901
    """Decode an ``ExtenderArgs`` body. Raises :class:`WireError` naming the bad field, :class:`TooLarge` when it
    lists more than ``max_node_names`` nodes. ``names``: where ``NodeNames`` lists seen before are kept.

    The Node objects of a nodeCacheCapable=false body are not decoded into dicts: one msgspec pass (C, ~3 ms a MB)
    finds where each one starts and ends, and only its ``metadata.name`` is read, one node at a time, so that a big
    body neither builds a tree of dicts ten times its size nor holds the GIL for a whole decode."""
    if not body:
        raise WireError("empty request body: expected a JSON object with Pod and Nodes or NodeNames")
    names_text: bytes | None = None
    pod_text: bytes | None = None
    try:
        data = _ARGS.decode(body)
        pod_text = bytes(data.Pod)
        pod, names_raw = _POD.decode(pod_text), None
        names_text = bytes(data.NodeNames)
        items = None if data.Nodes is None else data.Nodes.items or []
    except msgspec.ValidationError:  # (a subclass of DecodeError) valid JSON of another shape
        pod, names_raw, items = _other_shape(body)
    except msgspec.DecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's own depth limit (also while it skips over a Node object)
        raise WireError(_TOO_DEEP) from None
    _check_pod(pod)
    if names_text is not None and names_text != b"null":
        name_list = _cached_name_list(names_text, max_node_names, names)
        return ParsedArgs(pod=pod, name_list=name_list, node_objects=None, pod_text=pod_text)
    if names_raw is not None:
        return ParsedArgs(pod=pod, name_list=_name_list(names_raw, max_node_names), node_objects=None)
    if items is None:
        raise WireError("Nodes and NodeNames are both null: one of them must list the candidate nodes")
    if max_node_names is not None and len(items) > max_node_names:
        raise too_many_names("Nodes.items", len(items), max_node_names)
    seen: dict[str, None] = {}
    kept: list[orjson.Fragment] = []
    for i, raw in enumerate(items):
        text = bytes(raw)
        try:
            # The Node is echoed back verbatim: it must be valid UTF-8 as a whole (msgspec skips its other fields
            # unread), or kelvin's reply would not be valid JSON.
            text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(
                f"Nodes.items[{i}]: not valid UTF-8 (byte {text[exc.start]:#04x} at offset {exc.start} of the Node)"
            ) from None
        try:
            head = _NODE_HEAD.decode(text)
        except msgspec.ValidationError:
            head = _NodeHead()
        except msgspec.DecodeError as exc:  # pragma: no cover - the whole body and the Node's bytes were read above
            raise WireError(f"Nodes.items[{i}]: not valid JSON: {exc}") from None
        name = head.metadata.name if head.metadata is not None else None
        if not isinstance(name, str):
            raise WireError(f"Nodes.items[{i}].metadata.name: missing or not a string")
        if name not in seen:
            seen[name] = None
            kept.append(orjson.Fragment(text))
    return ParsedArgs(pod=pod, name_list=NodeNameList(list(seen), len(items)), node_objects=kept, pod_text=pod_text)


def parse_binding(body: bytes) -> ExtenderBindingArgs:
    data = _loads(body, "a JSON object with PodName, PodNamespace, PodUID and Node (ExtenderBindingArgs)")
    if not isinstance(data, dict):
        raise WireError(f"request body must be a JSON object (ExtenderBindingArgs), not {_type_name(data)}")
    for key in ("PodName", "PodNamespace", "Node"):
        v = data.get(key)
        if not isinstance(v, str) or not v:
            raise WireError(f"{key}: must be a non-empty string, not {v!r}")
    uid = data.get("PodUID", "")
    if not isinstance(uid, str):
        raise WireError(f"PodUID: must be a string, not {_type_name(uid)}")
    return ExtenderBindingArgs(
        PodName=data["PodName"], PodNamespace=data["PodNamespace"], PodUID=uid, Node=data["Node"]
    )


def filter_result(
    args: ParsedArgs,
    passed: Sequence[int] | IntA,
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
    *,
    names: NameCache | None = None,
) -> dict[str, Any]:
    """An ``ExtenderFilterResult`` dict in the mode of the request. ``passed`` are positions in ``args.names``;
    ``names``: where the passed names are kept for the prioritize that follows (:meth:`NameCache.put_passed`)."""
    if args.node_objects is None:
        kept = args.name_list.passed(np.asarray(passed, dtype=np.int64))
        if names is not None and kept is not args.name_list:
            names.put_passed(kept)
        return {
            "Nodes": None,
            "NodeNames": kept.names,
            "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": dict(unresolvable),
            "Error": error,
        }
    return {
        "Nodes": {"metadata": {}, "items": [args.node_objects[i] for i in passed]},
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def error_result(message: str) -> dict[str, Any]:
    """A filter reply carrying only ``Error``: kube-scheduler marks the pod unschedulable with this message
    (``PodScheduled=False``, reason ``SchedulerError``) and retries with backoff; ignorable extenders are skipped."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
