"""Parse ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``.

With a header, the field names and units come from it (``memory.total [MiB]``); without one the
caller passes the fields it asked for. ``[N/A]`` and ``[Not Supported]`` become None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from fstrain.core.topo.topology import Gpu, normalize_pci_bus_id
from fstrain.errors import ParseError

# The fields the probe asks for when NVML (pynvml) is not importable; driver-version dependent
# ones come last so the probe can drop them when nvidia-smi rejects them.
PROBE_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "memory.free", "driver_version",
                "temperature.gpu", "clocks.sm", "clocks.max.sm", "pcie.link.gen.max", "pcie.link.width.max",
                "compute_cap")
_HEADER_FIELD = re.compile(r"([A-Za-z_][\w.]*)(?:\s*\[([^\]]*)\])?")
_MISSING = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[GPU requires reset]", "[Insufficient Permissions]"}
_BYTES_PER_UNIT = {"MiB": 2**20, "GiB": 2**30, "KiB": 2**10, "B": 1}


def parse_query_gpu(text: str, fields: Sequence[str] | None = None,
                    source: str = "<nvidia-smi --query-gpu>") -> tuple[dict[str, str | None], ...]:
    """One dict per GPU: field -> value without its unit (None when nvidia-smi has no value)."""
    lines = [(n, line.strip()) for n, line in enumerate(text.replace("\r", "").split("\n"), 1) if line.strip()]
    units: list[str | None]
    if fields is None:
        if not lines:
            raise ParseError("empty output: no CSV header", hint="run nvidia-smi --query-gpu=... --format=csv",
                             where=source)
        number, header = lines.pop(0)
        names, units = [], []
        for cell in header.split(","):
            match = _HEADER_FIELD.fullmatch(cell.strip())
            if not match:
                raise ParseError(f"header cell {cell.strip()!r} is not a query field",
                                 hint="pass the csv output of nvidia-smi --query-gpu", where=f"{source}:{number}")
            names.append(match.group(1))
            units.append(match.group(2))
        fields = names
    else:
        units = [None] * len(fields)
        if lines and lines[0][1].split(",")[0].strip() == fields[0]:
            lines.pop(0)  # a header after all
    rows = []
    for number, line in lines:
        cells = [c.strip() for c in line.split(", ")] if ", " in line else [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ParseError(f"{len(cells)} values for {len(fields)} fields ({', '.join(fields)})",
                             hint="the output looks cut or mixed with other text", where=f"{source}:{number}")
        row: dict[str, str | None] = {}
        for name, unit, cell in zip(fields, units, cells, strict=True):
            if cell in _MISSING:
                row[name] = None
            elif unit and unit not in ("%",) and cell.endswith(" " + unit):
                row[name] = cell[: -len(unit) - 1]
            else:
                row[name] = cell.rstrip(" %") if unit == "%" else cell
        rows.append(row)
    return tuple(rows)


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def gpus_from_query(rows: Sequence[Mapping[str, str | None]], memory_unit: str = "MiB") -> tuple[Gpu, ...]:
    """Topology GPUs from parsed rows (``index`` is required; the rest is used when present)."""
    gpus = []
    for pos, row in enumerate(rows):
        index = _int(row.get("index"))
        if index is None:
            raise ParseError(f"row {pos + 1} has no GPU index", hint="query the index field first")
        bus = row.get("pci.bus_id")
        memory = _int(row.get("memory.total"))
        gpus.append(Gpu(
            index=index,
            name=row.get("name"),
            uuid=row.get("uuid"),
            pci_bus_id=normalize_pci_bus_id(bus) if bus else None,
            memory_total_bytes=memory * _BYTES_PER_UNIT[memory_unit] if memory is not None else None,
            compute_capability=row.get("compute_cap"),
            pcie_generation=_int(row.get("pcie.link.gen.max")),
            pcie_width=_int(row.get("pcie.link.width.max")),
        ))
    return tuple(gpus)
