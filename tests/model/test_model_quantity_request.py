"""Quantities and pod GPU requests: exact parsing, and errors that name the annotation or resource."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from scheduler_plugin.model import GIB, RequestError, Topology, parse_pod
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.quantity import (
    QuantityError,
    format_gib,
    parse_bytes,
    parse_cpu_milli,
    parse_quantity,
)
from tests.fleet_helpers import pod, request


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20Gi", Decimal(20 * 2**30)),
        ("512Mi", Decimal(512 * 2**20)),
        ("1.5", Decimal("1.5")),
        ("500m", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("2k", Decimal(2000)),
        ("1G", Decimal(10**9)),
        (" 3 ", Decimal(3)),
        (7, Decimal(7)),
        (0.25, Decimal("0.25")),
        (".5", Decimal("0.5")),
    ],
)
def test_quantities(text: str | int | float, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "20 Gi", "20gb", "abc", "1.2.3", "--1", True, float("nan"), float("inf")])
def test_bad_quantities(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)  # type: ignore[arg-type]


def test_bytes_and_cpu() -> None:
    assert parse_bytes("1.5Ki") == 1536
    assert parse_bytes("0.1") == 1  # rounded up
    assert parse_cpu_milli("2") == 2000
    assert parse_cpu_milli("250m") == 250
    with pytest.raises(QuantityError, match="negative"):
        parse_bytes("-1Gi")
    assert format_gib(12 * GIB) == "12.0 GiB"


def test_whole_gpu_request_from_pod() -> None:
    r = parse_pod(pod({ann.TOPOLOGY: "nvlink-required", ann.GPU_MODELS: "A100, H100"}, gpus=4))
    assert r.count == 4
    assert r.whole and not r.shared
    assert r.topology is Topology.NVLINK_REQUIRED
    assert r.models == frozenset({"A100", "H100"})
    assert r.pod_key == "default/p"
    assert r.cpu_milli == 1000
    assert r.describe() == "4 whole GPUs"


def test_shared_request_from_annotations() -> None:
    r = parse_pod(pod({ann.GPU_MEMORY: "20Gi", ann.GPU_SHARE: "250", ann.MAX_TEMPERATURE: "78"}))
    assert r.count == 1
    assert r.shared
    assert r.memory_bytes == 20 * GIB
    assert r.milli == 250
    assert r.max_temperature == 78.0
    assert r.describe() == "a share of one GPU (20 GiB, 25% of compute)"
    # memory in thousandths of each GPU: 20 of 80 GiB is 250, of 40 GiB is 500; more than the GPU never fits
    need = r.demand_milli(np.array([80 * GIB, 40 * GIB, 16 * GIB], dtype=np.int64))
    assert need.tolist() == [250, 500, 1001]


def test_no_gpu_pod() -> None:
    r = parse_pod(pod())
    assert not r.wants_gpu
    assert r.describe() == "no GPU"


@pytest.mark.parametrize(
    ("annotations", "gpus", "field", "problem"),
    [
        ({ann.GPU_MEMORY: "twenty"}, None, ann.GPU_MEMORY, "not a memory quantity"),
        ({ann.GPU_MEMORY: "0Gi"}, None, ann.GPU_MEMORY, "must be more than zero"),
        ({ann.GPU_MEMORY: "20"}, None, ann.GPU_MEMORY, "has no memory unit (a bare number would be bytes)"),
        ({ann.GPU_MEMORY: "21474836480"}, None, ann.GPU_MEMORY, "give one, e.g. 20Gi"),
        ({ann.GPU_MEMORY: "2e10"}, None, ann.GPU_MEMORY, "has no memory unit"),
        ({ann.GPU_MEMORY: "512Ki"}, None, ann.GPU_MEMORY, "must be at least 1Mi"),
        ({ann.GPU_MEMORY: "1000k"}, None, ann.GPU_MEMORY, "must be at least 1Mi"),
        ({ann.GPU_MEMORY: "20Gi"}, 2, ann.GPU_MEMORY, "means one shared GPU"),
        ({ann.GPU_SHARE: "half"}, None, ann.GPU_SHARE, "must be an integer"),
        ({ann.GPU_SHARE: "1001"}, None, ann.GPU_SHARE, "between 1 and 1000"),
        ({ann.GPU_SHARE: "500"}, 2, ann.GPU_SHARE, "cannot be combined with 2 whole GPUs"),
        ({ann.GPU_MODELS: "A100,,H100"}, 1, ann.GPU_MODELS, "comma-separated list"),
        ({ann.TOPOLOGY: "nvlink"}, 2, ann.TOPOLOGY, "must be one of nvlink-required, nvlink-preferred, any"),
        ({ann.MAX_TEMPERATURE: "hot"}, 1, ann.MAX_TEMPERATURE, "temperature in Celsius"),
        ({ann.MAX_TEMPERATURE: "200"}, 1, ann.MAX_TEMPERATURE, "between 20 and 120"),
        ({}, "1.5", "container 'main' resource nvidia.com/gpu", "not a whole number of GPUs"),
        ({}, "two", "container 'main' resource nvidia.com/gpu", "not a quantity"),
    ],
)
def test_errors_name_the_field(annotations: dict[str, str], gpus: object, field: str, problem: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_pod(pod(annotations, gpus=gpus))  # type: ignore[arg-type]
    assert exc.value.field == field
    assert problem in exc.value.problem
    assert str(exc.value).startswith(f"{field}=")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "Pod"),
        ({"metadata": ["x"], "spec": {}}, "Pod"),
        ({"metadata": {}, "spec": {"containers": "abc"}}, "spec.containers"),
        ({"metadata": {}, "spec": {"containers": {"a": 1}}}, "spec.containers"),
        ({"metadata": {}, "spec": {"initContainers": ["abc"]}}, "spec.initContainers"),
        ({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": ["x"]}]}}, "spec.containers[a].resources"),
        ({"metadata": {}, "spec": {"priority": "high"}}, "spec.priority"),
        ({"metadata": {}, "spec": {"overhead": ["x"]}}, "spec.overhead"),
        ({"metadata": {}, "spec": {"overhead": {"cpu": "zz"}}}, "spec.overhead.cpu"),
        ({"metadata": {"annotations": {ann.GPU_MEMORY: 5}}, "spec": {}}, ann.GPU_MEMORY),
        (
            {
                "metadata": {},
                "spec": {"containers": [{"name": "a", "resources": {"limits": {ann.GPU_RESOURCE: "1e400"}}}]},
            },
            "container 'a' resource nvidia.com/gpu",
        ),
        ({"metadata": {"annotations": ["x"]}, "spec": {}}, "metadata.annotations"),
        # an empty value of the wrong type is an error, not "no containers"
        ({"metadata": {}, "spec": {"containers": {}}}, "spec.containers"),
        ({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": ""}]}}, "spec.containers[a].resources"),
        # quantities beyond int64 (or with absurd exponents) are refused, never overflow later
        (
            {"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "9e18"}}}]}},
            "container 'a' resource cpu",
        ),
        (
            {
                "metadata": {"annotations": {ann.GPU_MEMORY: "1e30"}},
                "spec": {"containers": [{"name": "a", "resources": {"limits": {ann.GPU_RESOURCE: "1"}}}]},
            },
            ann.GPU_MEMORY,
        ),
        (
            {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": ["x"]}}]}},
            "spec.containers[c].resources.limits",
        ),
    ],
)
def test_malformed_pods(body: object, field: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_pod(body)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_init_containers_and_limits_only() -> None:
    body = {
        "metadata": {"name": "x"},
        "spec": {
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        },
    }
    assert parse_pod(body).count == 2


def test_helper_request_matches_parse() -> None:
    assert request(2, topology="nvlink-preferred").topology is Topology.NVLINK_PREFERRED


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1e999999999", "exponent out of range"),
        ("1e400", "exponent out of range"),
        ("8Ei", "too large"),
        ("9223372036854775808", "too large"),
        ("1" * 80, "longer than 64 characters"),
    ],
)
def test_quantities_are_bounded(text: str, problem: str) -> None:
    with pytest.raises(QuantityError, match=problem):
        parse_bytes(text)
    assert parse_bytes("7Ei") == 7 * 2**60  # the largest binary quantity below the bound still parses


def shared_slot_pod(slots: object, annotations: dict[str, str], gpus: object = None) -> dict[str, object]:
    limits = {ann.SHARED_GPU_RESOURCE: str(slots)}
    if gpus is not None:
        limits[ann.GPU_RESOURCE] = str(gpus)
    return {
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def test_gpu_memory_with_a_unit_of_at_least_one_mebibyte() -> None:
    """Before: ``"20"`` was silently a 20-byte pool (issue 10 item 11)."""
    assert parse_pod(pod({ann.GPU_MEMORY: "1Mi"})).memory_bytes == 2**20
    assert parse_pod(pod({ann.GPU_MEMORY: "20G"})).memory_bytes == 20 * 10**9
    assert parse_pod(pod({ann.GPU_MEMORY: " 1.5Gi "})).memory_bytes == 3 * 2**29


def test_pool_only_pod_is_one_shared_gpu() -> None:
    """A pod with kelvin.dev/gpu-memory and no nvidia.com/gpu (issue 10 item 8) asks for a share of one GPU."""
    r = parse_pod(pod({ann.GPU_MEMORY: "20Gi"}, gpus=None))
    assert (r.count, r.shared, r.milli, r.memory_bytes) == (1, True, None, 20 * GIB)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [({ann.GPU_MEMORY: "20Gi"}, (1, None, 20 * GIB)), ({ann.GPU_SHARE: "300"}, (1, 300, None))],
)
def test_shared_gpu_resource_is_a_share_of_one_gpu(annotations: dict[str, str], want: tuple[object, ...]) -> None:
    r = parse_pod(shared_slot_pod(1, annotations))
    assert r.shared and (r.count, r.milli, r.memory_bytes) == want


@pytest.mark.parametrize(
    ("slots", "annotations", "gpus", "problem"),
    [
        (1, {}, None, f"needs its size: add the annotation {ann.GPU_MEMORY}"),
        (2, {ann.GPU_MEMORY: "20Gi"}, None, "at most one slot of one shared GPU"),
        (1, {ann.GPU_MEMORY: "20Gi"}, 1, f"cannot be combined with 1 whole GPU(s) ({ann.GPU_RESOURCE})"),
        (1, {}, 2, f"cannot be combined with 2 whole GPU(s) ({ann.GPU_RESOURCE})"),
    ],
)
def test_shared_gpu_resource_errors_name_it(
    slots: int, annotations: dict[str, str], gpus: int | None, problem: str
) -> None:
    with pytest.raises(RequestError) as exc:
        parse_pod(shared_slot_pod(slots, annotations, gpus))
    assert exc.value.field == ann.SHARED_GPU_RESOURCE and problem in exc.value.problem
    assert ann.SHARED_GPU_RESOURCE in str(exc.value)


@pytest.mark.parametrize("text", ["２０Gi", "٥", "१००", "1_000", "５00m", "1e٣", "٣e3"])
def test_quantities_are_ascii_only(text: str) -> None:
    """Kubernetes quantities are ASCII: other Unicode digits (which ``\\d`` and Decimal() accept) are not numbers."""
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (ann.GPU_SHARE, "٥٠٠"),
        (ann.GPU_SHARE, "5_00"),
        (ann.GPU_SHARE, "१००"),
        (ann.GPU_SHARE, "５００"),
        (ann.GPU_MEMORY, "２０Gi"),
        (ann.GPU_MEMORY, "2_0Gi"),
        (ann.MAX_TEMPERATURE, "٧٨"),
        (ann.MAX_TEMPERATURE, "7_8"),
        (ann.MAX_TEMPERATURE, "７８C"),
        (ann.MAX_TEMPERATURE, "inf"),
        (ann.MAX_TEMPERATURE, "nan"),
    ],
)
def test_annotation_numbers_are_ascii_only(annotation: str, value: str) -> None:
    """The parser the extender and the operator's webhook share refuses what int()/float() would read."""
    with pytest.raises(RequestError) as e:
        parse_pod(pod({annotation: value}, gpus=1))
    assert e.value.field == annotation


@pytest.mark.parametrize(
    ("annotation", "value", "attr", "want"),
    [
        (ann.GPU_SHARE, "500", "milli", 500),
        (ann.GPU_SHARE, " 0460 ", "milli", 460),
        (ann.GPU_MEMORY, "20Gi", "memory_bytes", 20 * GIB),
        (ann.MAX_TEMPERATURE, "77.5", "max_temperature", 77.5),
        (ann.MAX_TEMPERATURE, "78°C", "max_temperature", 78.0),
    ],
)
def test_ascii_annotation_numbers_still_parse(annotation: str, value: str, attr: str, want: object) -> None:
    assert getattr(parse_pod(pod({annotation: value}, gpus=1)), attr) == want


def test_a_gpu_share_of_many_digits_is_out_of_range_not_a_crash() -> None:
    with pytest.raises(RequestError, match="between 1 and 1000"):
        parse_pod(pod({ann.GPU_SHARE: "9" * 5000}, gpus=1))


@pytest.mark.parametrize(
    ("resource", "value", "n"),
    [("memory", "7Ei", 2), ("cpu", "9223372036854775", 2), ("nvidia.com/gpu", "600", 2), ("memory", "1Ei", 9)],
)
def test_sums_over_containers_are_bounded_like_single_values(resource: str, value: str, n: int) -> None:
    containers = [{"name": f"c{i}", "resources": {"requests": {resource: value}}} for i in range(n)]
    parse_pod({**pod(), "spec": {"containers": containers[:1]}})  # one alone is in range
    with pytest.raises(RequestError) as e:
        parse_pod({**pod(), "spec": {"containers": containers}})
    assert e.value.field == f"resource {resource}" and "effective request" in e.value.problem
