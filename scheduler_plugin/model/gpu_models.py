"""GPU model names: does an item of ``kelvin.dev/gpu-models`` (``A100``, ``H100-80GB``) name a GPU that telemetry
reports as ``NVIDIA A100-SXM4-80GB``? Pure; the one matcher used by the filter, the webhook, the fragmentation
estimate and the simulator. The rules are documented in docs/annotations.md.

A name is read as words (split on spaces, ``-``, ``_`` and ``/``, case-insensitive) after dropping the brand words
``NVIDIA``, ``Tesla``, ``Quadro`` and ``GeForce``:

* the **family** is the first word (``A100``, ``H100``, ``L40S``, ``T4``, ``GH200``), or the first two for ``RTX``
  names (``RTX 6000``, ``RTX A6000``, ``RTX 4090``);
* a word ``<n>GB`` (or ``<n>G``, ``<n>Gi``, ``<n>GiB``) is the **memory size**;
* ``SXM``/``SXM2``/``SXM4``/``SXM5``, ``PCIe`` and ``NVL`` are the **form factor**;
* every other word (``HBM3``, ``Ada``) is a plain **tag**.

Some NVML names leave out what is implied: ``NVIDIA H100 80GB HBM3`` is the SXM part, ``NVIDIA H200`` is a 141 GB
SXM part, ``NVIDIA H100 PCIe`` has 80 GB. :data:`_IMPLIED_FORM` and :data:`_IMPLIED_MEMORY_GB` fill those in for the
GPU's name (never for the pod's item). ``NVIDIA GH200 480GB`` gives the superchip's CPU + GPU memory: its GPU has
96 GB (:data:`_SUPERCHIP_MEMORY_GB`).

``A6000`` (``A4000``, ``A5000``) is read as ``RTX A6000``, ``RTX4090`` as ``RTX 4090``. ``Ada`` is a generation tag:
``RTX 6000`` names only the Quadro RTX 6000 (Turing), ``RTX 6000 Ada`` only the RTX 6000 Ada Generation.

An item matches a GPU when the two names are equal (case and spacing aside), or when the families are equal and
every further part the item gives (memory size, form factor, tags) is also part of the GPU's name. Families compare
as whole words: ``A10`` never matches ``A100``, ``L4`` never matches ``L40S``, ``H200`` never matches ``GH200``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

_BRANDS = frozenset({"NVIDIA", "TESLA", "QUADRO", "GEFORCE"})
_SEPARATORS = re.compile(r"[\s\-_/]+")
_MEMORY = re.compile(r"^(\d+)(?:GB|G|GIB|GI)$")
_SXM = re.compile(r"^SXM\d*$")

KNOWN_FAMILIES = frozenset(
    {
        "A2", "A10", "A10G", "A16", "A30", "A40", "A100", "A800",
        "B100", "B200", "GB200", "GH200", "H20", "H100", "H200", "H800",
        "K80", "L4", "L20", "L40", "L40S", "M60", "P4", "P40", "P100", "T4", "V100",
        "RTX 4090", "RTX 6000", "RTX A4000", "RTX A5000", "RTX A6000", "RTX 8000",
    }
)  # fmt: skip
"""Families kelvin knows by name. An item of another family is still accepted (a GPU newer than this list); it only
matches GPUs whose name has that family."""

_IMPLIED_FORM = {"H100": "SXM", "H200": "SXM", "H800": "SXM", "B200": "SXM", "B100": "SXM"}
"""Family -> form factor of a GPU whose NVML name gives none (``NVIDIA H100 80GB HBM3``, ``NVIDIA H200``)."""

_IMPLIED_MEMORY_GB = {
    ("H800", "SXM"): 80,
    ("H800", "PCIE"): 80,
    ("B200", "SXM"): 180,
    ("GB200", None): 186,
    ("GH200", None): 96,
    ("H100", "PCIE"): 80,
    ("H100", "SXM"): 80,
    ("H100", "NVL"): 94,
    ("H200", "SXM"): 141,
    ("H200", "NVL"): 141,
    ("L4", None): 24,
    ("L40", None): 48,
    ("L40S", None): 48,
    ("T4", None): 16,
    ("A10", None): 24,
    ("A10G", None): 24,
    ("A30", None): 24,
    ("A40", None): 48,
}
"""(family, form factor) -> memory size (GB) of a GPU whose NVML name gives none."""

_SUPERCHIP_MEMORY_GB = {("GH200", 480): 96, ("GH200", 624): 144}
"""(family, size in the NVML name) -> the GPU's own memory (GB), where the name gives the superchip's CPU + GPU memory:
``NVIDIA GH200 480GB`` is 480 GB LPDDR5X + HBM3 of which the GPU has 96 GB (``NVIDIA GH200 144G HBM3e``: 144 GB)."""

_GENERATION_TAGS = frozenset({"ADA"})
"""Tags that make another card under the same family name (``RTX 6000 Ada Generation`` is not the ``Quadro RTX
6000``): a GPU with one matches only items that give it too."""

_RTX_JOINED = re.compile(r"^RTX(A?\d{4})$")
_RTX_A_SERIES = re.compile(r"^A[2-6]000$")


@dataclass(frozen=True, slots=True)
class ModelName:
    """A GPU model name read into its parts (see the module docstring)."""

    text: str
    """The whole name, upper case, brand words dropped, words joined by single spaces."""
    family: str
    memory_gb: int | None
    form: str | None
    tags: frozenset[str]

    @property
    def known_family(self) -> bool:
        return self.family in KNOWN_FAMILIES


@lru_cache(maxsize=4096)
def parse_model(name: str) -> ModelName:
    """Read a model name (a GPU's, as telemetry reports it, or an item of ``kelvin.dev/gpu-models``)."""
    words = [w for w in _SEPARATORS.split(name.strip().upper()) if w]
    while words and words[0] in _BRANDS:
        words.pop(0)
    if not words:
        return ModelName("", "", None, None, frozenset())
    joined = _RTX_JOINED.match(words[0])
    if joined:  # RTX4090, RTXA6000 -> RTX 4090, RTX A6000
        words[:1] = ["RTX", joined.group(1)]
    elif _RTX_A_SERIES.match(words[0]):  # A6000 is only ever the RTX A6000
        words.insert(0, "RTX")
    n = 2 if words[0] == "RTX" and len(words) > 1 else 1
    family = " ".join(words[:n])
    memory: int | None = None
    form: str | None = None
    tags: set[str] = set()
    for w in words[n:]:
        m = _MEMORY.match(w)
        if m and memory is None:
            memory = int(m.group(1))
        elif _SXM.match(w) and form is None:
            form = "SXM"
        elif w in ("PCIE", "NVL") and form is None:
            form = w
        else:
            tags.add(w)
    return ModelName(" ".join(words), family, memory, form, frozenset(tags))


@lru_cache(maxsize=4096)
def _gpu_parts(name: str) -> ModelName:
    """A GPU's name with the implied form factor and memory size filled in."""
    got = parse_model(name)
    form = got.form or _IMPLIED_FORM.get(got.family)
    if got.memory_gb is None:
        memory = _IMPLIED_MEMORY_GB.get((got.family, form))
    else:
        memory = _SUPERCHIP_MEMORY_GB.get((got.family, got.memory_gb), got.memory_gb)
    return ModelName(got.text, got.family, memory, form, got.tags)


def memory_gb(gpu_model: str) -> int | None:
    """The memory size (GB) a GPU's name gives or implies (``NVIDIA L4``: 24, ``A100-SXM4-40GB``: 40); ``None``
    when the name does not tell (``A100`` comes with 40 or 80 GB)."""
    return _gpu_parts(gpu_model).memory_gb


def item_matches(item: str, gpu_model: str) -> bool:
    """Whether one item of ``kelvin.dev/gpu-models`` names a GPU that telemetry reports as ``gpu_model``."""
    want = parse_model(item)
    have = _gpu_parts(gpu_model)
    if not want.family or not have.family:
        return False
    if want.text == have.text:
        return True
    return (
        want.family == have.family
        and (want.memory_gb is None or want.memory_gb == have.memory_gb)
        and (want.form is None or want.form == have.form)
        and want.tags <= have.tags
        and have.tags & _GENERATION_TAGS <= want.tags
    )


@lru_cache(maxsize=16384)
def matches_any(items: frozenset[str], gpu_model: str) -> bool:
    """Whether any item matches ``gpu_model``. Cached per distinct (item set, model): cheap on the filter path."""
    return any(item_matches(item, gpu_model) for item in items)


def matching_models(items: frozenset[str], models: Iterable[str]) -> list[str]:
    """The names among ``models`` that some item matches, in their order."""
    return [m for m in models if matches_any(items, m)]


def unknown_items(items: Iterable[str]) -> list[str]:
    """Items whose family kelvin does not know (accepted; useful in messages when nothing matches)."""
    return sorted(i for i in items if not parse_model(i).known_family)
