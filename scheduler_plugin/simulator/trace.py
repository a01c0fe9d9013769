"""Trace input: the openb CSV format (Alibaba cluster-trace-gpu-v2023) and kelvin's own YAML/CSV cluster format.

Everything is read into two plain lists, :class:`TraceNode` and :class:`TracePod`. Bad input raises
:class:`TraceError` naming the file, the row (1-based, header is row 1) and the column.

openb columns (see ``../shared/traces/openb/README.md``)::

    nodes: sn,cpu_milli,memory_mib,gpu,model[,gpu_memory]
    pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec],...   (extra columns are ignored)

``gpu_spec`` (allowed GPU models, ``|``-separated) may be empty or absent: the public ``openb_pod_list_multigpu*``
files have no such column; either way the pod takes any GPU model.

kelvin's own format is YAML (a mapping with ``nodes:`` and/or ``pods:`` lists) or CSV with these columns::

    nodes: name,count,cpu,memory,gpus,gpu_model[,gpu_memory]
    pods:  name,count,cpu,memory,gpus[,gpu_share][,gpu_memory][,gpu_models]

``cpu`` and ``memory`` are Kubernetes quantities (``8``, ``500m``, ``32Gi``); ``count`` repeats the row (names get
``-0``, ``-1`` ... suffixes); ``gpu_share`` is thousandths of one GPU (1..1000); ``gpu_models`` is ``|`` separated.

A node's ``gpu_memory`` (memory per GPU, a quantity) may be left out for a model whose memory kelvin knows
(:func:`~scheduler_plugin.simulator.fleet.known_gpu_memory_bytes`: openb's models, ``L4``, ``NVIDIA H100 80GB HBM3``
...); for any other model it is required, and a file without it is refused naming the row and the model.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import yamlfile
from ..model.gpu import MIB, MILLI_PER_GPU
from ..model.quantity import QuantityError, parse_bytes, parse_cpu_milli
from ..model.request import GpuRequest
from ..textfile import TextFileError, read_text
from .fleet import known_gpu_memory_bytes

OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Required pod columns; ``gpu_spec`` is optional (absent means no model constraint)."""
OWN_NODE_COLUMNS = ("name", "cpu", "memory", "gpus", "gpu_model")
OWN_POD_COLUMNS = ("name", "cpu", "memory", "gpus")


class TraceError(ValueError):
    """Input the simulator cannot use; the message names the file, row and column."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_bytes: int
    gpus: int
    model: str
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_bytes: int
    num_gpu: int
    gpu_milli: int
    """Per-GPU share in thousandths (1000 for whole GPUs; 0 for CPU-only pods)."""
    gpu_spec: frozenset[str] | None = None
    gpu_memory_bytes: int | None = None

    def request(self) -> GpuRequest:
        """The :class:`GpuRequest` the extender would parse from this pod."""
        shared = self.num_gpu == 1 and (self.gpu_milli < MILLI_PER_GPU or self.gpu_memory_bytes is not None)
        milli: int | None = self.gpu_milli if shared else MILLI_PER_GPU
        if shared and self.gpu_memory_bytes is not None and self.gpu_milli >= MILLI_PER_GPU:
            milli = None
        return GpuRequest(
            count=self.num_gpu,
            milli=milli,
            memory_bytes=self.gpu_memory_bytes if shared else None,
            models=self.gpu_spec,
            cpu_milli=self.cpu_milli,
            host_memory_bytes=self.memory_bytes,
            pod_key=self.name,
        )

    @property
    def gpu_demand_milli(self) -> int:
        """GPU thousandths this pod adds to the arrived workload."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True, slots=True)
class Trace:
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


# --------------------------------------------------------------------------------------------------------------- #
# Cell parsing with row/column context


def _where(path: Path, row: int, column: str) -> str:
    return f"{path}: row {row}, column {column!r}"


def _int(path: Path, row: int, column: str, raw: Any, lo: int, hi: int | None = None) -> int:
    text = str(raw).strip() if raw is not None else ""
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise TraceError(f"{_where(path, row, column)}: {text!r} is not an integer") from None
        if f != int(f):
            raise TraceError(f"{_where(path, row, column)}: {text!r} is not an integer") from None
        value = int(f)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise TraceError(f"{_where(path, row, column)}: {value} must be {bound}")
    return value


def _quantity(path: Path, row: int, column: str, raw: Any, parse: Callable[[Any], int]) -> int:
    if raw is None or str(raw).strip() == "":
        raise TraceError(f"{_where(path, row, column)}: missing value")
    try:
        value = parse(raw if not isinstance(raw, float) else repr(raw))
    except (QuantityError, ValueError) as exc:
        raise TraceError(f"{_where(path, row, column)}: {raw!r} is not a quantity ({exc})") from None
    if value < 0:
        raise TraceError(f"{_where(path, row, column)}: {raw!r} must not be negative")
    return value


def _models(raw: Any) -> frozenset[str] | None:
    if raw is None:
        return None
    items = raw if isinstance(raw, list) else str(raw).split("|")
    out = frozenset(str(m).strip() for m in items if str(m).strip())
    return out or None


def _gpu_memory(path: Path, row: int, columns: tuple[str, str], rec: Mapping[str, Any], gpus: int) -> int | None:
    """The node's memory per GPU (``columns``: the model's column, the memory's): the file's figure, else ``None``
    for a model whose memory kelvin knows. A model kelvin does not know must come with its memory."""
    model_col, mem_col = columns
    raw = rec.get(mem_col)
    if raw not in (None, ""):
        return _quantity(path, row, mem_col, raw, parse_bytes)
    model = str(rec.get(model_col) or "").strip()
    if gpus > 0 and known_gpu_memory_bytes(model) is None:
        raise TraceError(
            f"{_where(path, row, model_col)}: GPU model {model!r} is not one kelvin knows the memory of; "
            f"give each GPU's memory in {mem_col!r} (a quantity such as 24Gi)"
        )
    return None


def _read(path: Path) -> str:
    try:
        return read_text(path, "trace file")
    except TextFileError as exc:
        raise TraceError(str(exc)) from None


def _read_csv(path: Path, required: Iterable[str]) -> list[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(_read(path), newline=""))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"{path}: row 1 (header): missing column(s) {', '.join(missing)}")
    rows = []
    for n, rec in enumerate(reader, start=2):
        if None in rec:
            raise TraceError(f"{path}: row {n}: more cells than the header has columns")
        rows.append((n, rec))
    return rows


def _unique(path: Path, names: Iterable[tuple[int, str]], what: str) -> None:
    seen: dict[str, int] = {}
    for row, name in names:
        if not name:
            raise TraceError(f"{_where(path, row, 'name')}: empty {what} name")
        if name in seen:
            raise TraceError(f"{_where(path, row, 'name')}: duplicate {what} name {name!r} (first on row {seen[name]})")
        seen[name] = row


# --------------------------------------------------------------------------------------------------------------- #
# openb CSV


def read_openb_nodes(path: Path) -> list[TraceNode]:
    out = []
    for row, rec in _read_csv(path, OPENB_NODE_COLUMNS):
        gpus = _int(path, row, "gpu", rec["gpu"], 0, 64)
        model = (rec["model"] or "").strip()
        if gpus > 0 and not model:
            raise TraceError(f"{_where(path, row, 'model')}: a node with GPUs needs a model")
        out.append(
            TraceNode(
                name=rec["sn"].strip(),
                cpu_milli=_int(path, row, "cpu_milli", rec["cpu_milli"], 0),
                memory_bytes=_int(path, row, "memory_mib", rec["memory_mib"], 0) * MIB,
                gpus=gpus,
                model=model,
                gpu_memory_bytes=_gpu_memory(path, row, ("model", "gpu_memory"), rec, gpus),
            )
        )
    _unique(path, ((i + 2, n.name) for i, n in enumerate(out)), "node")
    return out


def read_openb_pods(path: Path) -> list[TracePod]:
    out = []
    for row, rec in _read_csv(path, OPENB_POD_COLUMNS):
        num = _int(path, row, "num_gpu", rec["num_gpu"], 0, 64)
        milli = _int(path, row, "gpu_milli", rec["gpu_milli"], 0, MILLI_PER_GPU)
        if num == 0:
            milli = 0
        elif milli == 0:
            raise TraceError(f"{_where(path, row, 'gpu_milli')}: a pod with num_gpu={num} needs gpu_milli 1..1000")
        elif num > 1 and milli != MILLI_PER_GPU:
            raise TraceError(
                f"{_where(path, row, 'gpu_milli')}: {milli} with num_gpu={num}; only one GPU can be shared"
            )
        out.append(
            TracePod(
                name=rec["name"].strip(),
                cpu_milli=_int(path, row, "cpu_milli", rec["cpu_milli"], 0),
                memory_bytes=_int(path, row, "memory_mib", rec["memory_mib"], 0) * MIB,
                num_gpu=num,
                gpu_milli=milli,
                gpu_spec=_models(rec.get("gpu_spec")),
            )
        )
    return out


# --------------------------------------------------------------------------------------------------------------- #
# kelvin's own format (YAML or CSV)


def _expand(name: str, count: int) -> list[str]:
    return [name] if count == 1 else [f"{name}-{i}" for i in range(count)]


def _own_node(path: Path, row: int, rec: Mapping[str, Any]) -> list[TraceNode]:
    count = _int(path, row, "count", rec.get("count", 1) or 1, 1, 100_000)
    gpus = _int(path, row, "gpus", rec.get("gpus", 0) or 0, 0, 64)
    model = str(rec.get("gpu_model") or "").strip()
    if gpus > 0 and not model:
        raise TraceError(f"{_where(path, row, 'gpu_model')}: a node with GPUs needs a gpu_model")
    gmem = _gpu_memory(path, row, ("gpu_model", "gpu_memory"), rec, gpus)
    cpu = _quantity(path, row, "cpu", rec.get("cpu"), parse_cpu_milli)
    mem = _quantity(path, row, "memory", rec.get("memory"), parse_bytes)
    return [TraceNode(nm, cpu, mem, gpus, model, gmem) for nm in _expand(str(rec.get("name") or "").strip(), count)]


def _own_pod(path: Path, row: int, rec: Mapping[str, Any]) -> list[TracePod]:
    count = _int(path, row, "count", rec.get("count", 1) or 1, 1, 10_000_000)
    gpus = _int(path, row, "gpus", rec.get("gpus", 0) or 0, 0, 64)
    share_raw = rec.get("gpu_share")
    share = _int(path, row, "gpu_share", share_raw, 1, MILLI_PER_GPU) if share_raw not in (None, "") else None
    gmem_raw = rec.get("gpu_memory")
    gmem = _quantity(path, row, "gpu_memory", gmem_raw, parse_bytes) if gmem_raw not in (None, "") else None
    if (share is not None or gmem is not None) and gpus != 1:
        col = "gpu_share" if share is not None else "gpu_memory"
        raise TraceError(f"{_where(path, row, col)}: a GPU share needs gpus: 1 (got {gpus})")
    milli = 0 if gpus == 0 else (share if share is not None else MILLI_PER_GPU)
    cpu = _quantity(path, row, "cpu", rec.get("cpu"), parse_cpu_milli)
    mem = _quantity(path, row, "memory", rec.get("memory", 0) or 0, parse_bytes)
    spec = _models(rec.get("gpu_models"))
    return [
        TracePod(nm, cpu, mem, gpus, milli, spec, gmem) for nm in _expand(str(rec.get("name") or "").strip(), count)
    ]


def read_own(path: Path, kind: str) -> list[Any]:
    """Read ``kind`` ("nodes" or "pods") from a kelvin YAML or CSV file."""
    parse_one = _own_node if kind == "nodes" else _own_pod
    if path.suffix.lower() in {".yaml", ".yml"}:
        try:
            doc = yamlfile.safe_load(_read(path))
        except yaml.YAMLError as exc:
            raise TraceError(f"{path}: not valid YAML ({yamlfile.describe(exc)})") from None
        items = doc.get(kind) if isinstance(doc, Mapping) else None
        if not isinstance(items, list):
            raise TraceError(f"{path}: expected a mapping with a list under {kind!r}")
        rows: list[tuple[int, Mapping[str, Any]]] = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TraceError(f"{path}: {kind}[{i}] must be a mapping")
            rows.append((i, item))
        out: list[Any] = []
        for i, item in rows:
            try:
                out.extend(parse_one(path, i, item))
            except TraceError as exc:
                raise TraceError(str(exc).replace(f"row {i},", f"{kind}[{i}],", 1)) from None
    else:
        required = OWN_NODE_COLUMNS if kind == "nodes" else OWN_POD_COLUMNS
        out = []
        for row, rec in _read_csv(path, required):
            out.extend(parse_one(path, row, rec))
    names = [(i, getattr(x, "name", "")) for i, x in enumerate(out)]
    if kind == "nodes":
        _unique(path, names, "node")
    return out


def _is_openb(path: Path, columns: tuple[str, ...]) -> bool:
    if path.suffix.lower() != ".csv":
        return False
    header = next(csv.reader(io.StringIO(_read(path).partition("\n")[0])), [])
    return all(c in header for c in columns)


def load_nodes(path: Path) -> list[TraceNode]:
    nodes = read_openb_nodes(path) if _is_openb(path, ("sn", "gpu")) else read_own(path, "nodes")
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path) -> list[TracePod]:
    pods = read_openb_pods(path) if _is_openb(path, ("num_gpu", "gpu_milli")) else read_own(path, "pods")
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def load_trace(nodes: Path, pods: Path) -> Trace:
    return Trace(tuple(load_nodes(nodes)), tuple(load_pods(pods)))
