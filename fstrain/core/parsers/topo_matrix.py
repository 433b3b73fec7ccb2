"""Parse ``nvidia-smi topo -m`` (also ``-mp`` and ``--matrix``) into a :class:`TopoMatrix`.

Handles the variants seen in the wild: TAB-separated output as nvidia-smi prints it, the same
expanded to spaces by a terminal copy (empty cells then survive only as column positions),
markdown-table and hand-condensed re-formats, ANSI underline residue, trailing TABs, the extra
TAB before ``GPU NUMA ID``, ``mlx5_N`` or ``NICn`` columns with a NIC Legend, empty CPU affinity
cells (Slurm cgroups) and the legacy ``SOC`` legend.

A paste that is cut inside the matrix or garbled (a lost TAB, an asymmetric matrix) raises
:class:`~fstrain.errors.ParseError` naming the line: a wrong topology is worse than none. A paste
whose matrix is complete but whose legend is cut parses; what the legend would have said (the NIC
names) is reported in :attr:`TopoMatrix.warnings`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fstrain.core.topo.topology import Gpu, LinkClass, Nic, Node, parse_cpu_list, parse_link_label
from fstrain.errors import ParseError

INFO_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# Terminal escapes (CSI sequences, charset switches), also as "^[" text or with the ESC lost ("[4m").
_ANSI = re.compile(r"(?:\x1b|\^\[)(?:\[[0-9;?]*[A-Za-z]|\([A-Z0-9])|\[[0-9;]*m")
_SPACE_TOKEN = re.compile("|".join(re.escape(c) for c in INFO_COLUMNS) + r"|\S+")
_GPU_LABEL = re.compile(r"GPU(\d+)")
_NICN_LABEL = re.compile(r"NIC\d+")
_LEGEND_ENTRY = re.compile(r"^\s*(X|SYS|NODE|PHB|PXB|PIX|SOC|NV#)\s*=")
_NIC_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_HINT_RECAPTURE = "capture it again with `nvidia-smi topo -m > topo.txt` and pass the file"


@dataclass(frozen=True)
class TopoMatrix:
    """What one ``nvidia-smi topo -m`` output says, cell by cell."""

    source: str
    layout: str  # tabs | spaces | markdown
    gpu_labels: tuple[str, ...]
    nic_labels: tuple[str, ...]
    nic_names: tuple[str | None, ...]  # from the column label or the NIC Legend; None if unknown
    matrix: tuple[tuple[str, ...], ...]  # labels as printed (X, NV12, SOC ...), GPUs then NICs
    info_columns: tuple[str, ...]  # the affinity columns present, in file order
    info: tuple[tuple[str, ...], ...]  # per GPU row, one raw value per info column ("" = empty)
    legend: str  # modern | legacy | none
    warnings: tuple[str, ...]  # facts the paste does not give, in words

    @property
    def devices(self) -> tuple[str, ...]:
        return self.gpu_labels + self.nic_labels

    def info_value(self, gpu_position: int, column: str) -> str | None:
        """The raw cell of an info column for a GPU row; None when the column is absent."""
        if column not in self.info_columns:
            return None
        return self.info[gpu_position][self.info_columns.index(column)]


@dataclass(frozen=True)
class _Token:
    text: str
    column: int  # character position (spaces layout) or cell index (tabs/markdown)


@dataclass(frozen=True)
class _Line:
    number: int
    text: str

    @property
    def layout(self) -> str:
        if self.text.lstrip().startswith("|"):
            return "markdown"
        return "tabs" if "\t" in self.text else "spaces"

    def cells(self) -> list[_Token]:
        """Cells with empty ones kept for tabs/markdown; spaces lose them (positions remain)."""
        if self.layout == "markdown":
            inner = self.text.strip()
            inner = inner[1:-1] if inner.endswith("|") and len(inner) > 1 else inner[1:]
            return [_Token(c.strip(), i) for i, c in enumerate(inner.split("|"))]
        if self.layout == "tabs":
            return [_Token(c.strip(), i) for i, c in enumerate(self.text.split("\t"))]
        return [_Token(m.group(), m.start()) for m in _SPACE_TOKEN.finditer(self.text)]

    def tokens(self) -> list[_Token]:
        return [t for t in self.cells() if t.text]


def _is_link_label(text: str) -> bool:
    try:
        parse_link_label(text)
    except ValueError:
        return False
    return True


def _clean_lines(text: str) -> list[_Line]:
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    return [_Line(i, _ANSI.sub("", raw)) for i, raw in enumerate(text.split("\n"), start=1)]


def _looks_like_row(line: _Line) -> bool:
    tokens = line.tokens()
    return len(tokens) >= 2 and not _is_info_column(tokens[0].text) and _is_link_label(tokens[1].text)


def _is_info_column(text: str) -> bool:
    return text in INFO_COLUMNS or " " in text or "Affinity" in text


def _find_header(lines: list[_Line], source: str) -> int:
    for pos, line in enumerate(lines):
        tokens = line.tokens()
        if tokens and tokens[0].text == "GPU" and line.layout == "markdown":
            tokens = tokens[1:]  # a markdown table's title cell
        if tokens and _GPU_LABEL.fullmatch(tokens[0].text) and not any(_is_link_label(t.text) for t in tokens):
            return pos
        if _looks_like_row(line):
            raise ParseError(
                f"matrix row {tokens[0].text!r} before any header line (the line listing GPU0 GPU1 ... "
                "CPU Affinity is missing)", hint=_HINT_RECAPTURE, where=f"{source}:{line.number}")
    raise ParseError("no nvidia-smi topo -m matrix found (no header line starting with GPU0)",
                     hint="pass the output of `nvidia-smi topo -m`", where=source)


def _split_header(line: _Line, source: str) -> tuple[list[str], list[_Token]]:
    tokens = line.tokens()
    if tokens and tokens[0].text == "GPU" and line.layout == "markdown":
        tokens = tokens[1:]
    devices: list[str] = []
    info: list[_Token] = []
    for tok in tokens:
        if _is_info_column(tok.text):
            info.append(tok)
        elif info:
            raise ParseError(f"device column {tok.text!r} after the affinity columns",
                             hint=_HINT_RECAPTURE, where=f"{source}:{line.number}")
        else:
            devices.append(tok.text)
    where = f"{source}:{line.number}"
    if len(set(devices)) != len(devices):
        raise ParseError("a device column appears twice in the header", hint=_HINT_RECAPTURE, where=where)
    first_nic = next((i for i, d in enumerate(devices) if not _GPU_LABEL.fullmatch(d)), len(devices))
    if any(_GPU_LABEL.fullmatch(d) for d in devices[first_nic:]):
        raise ParseError("GPU column after the NIC columns: not the nvidia-smi topo -m layout",
                         hint=_HINT_RECAPTURE, where=where)
    return devices, info


def _cells_from_tab_stops(tokens: list[_Token], after: int) -> list[str]:
    """Rebuild TAB-separated cells from a line that a terminal expanded to 8-column tab stops.

    Every cell starts on a tab stop and an empty cell is one TAB: 8 columns of blanks. ``after``
    is the column where the previous (matrix) cell ended. Raises ValueError if a value is not on a
    tab stop (a hand-aligned paste), where the empty cells cannot be told apart.
    """
    cells: list[str] = []
    for tok in tokens:
        stop = (after // 8 + 1) * 8
        start = tok.column // 8 * 8  # a cell may begin with a few blanks (" X ")
        if start < stop:
            raise ValueError(tok.text)
        cells.extend([""] * ((start - stop) // 8))
        cells.append(tok.text)
        after = tok.column + len(tok.text)
    return cells


def _row_info_values(line: _Line, cells: list[_Token], n_devices: int, names: list[str],
                     where: str) -> tuple[str, ...]:
    rest = cells[1 + n_devices:]
    if line.layout == "spaces":
        if len(rest) > len(names):
            raise ParseError(f"{len(rest)} values after the matrix cells but {len(names)} affinity columns",
                             hint=_HINT_RECAPTURE, where=where)
        if len(rest) == len(names):
            return tuple(t.text for t in rest)
        # Some cells are empty and vanished in the terminal copy: rebuild them from the tab stops.
        last = cells[n_devices]
        try:
            rest_text = _cells_from_tab_stops(rest, last.column + len(last.text))
        except ValueError as exc:
            raise ParseError(f"cannot tell which affinity column {exc} belongs to (hand-aligned paste with "
                             "empty cells)", hint=_HINT_RECAPTURE, where=where) from None
    else:
        rest_text = [t.text for t in rest]
    # Modern drivers print two TABs before "GPU NUMA ID": drop the empty cell they leave.
    if "GPU NUMA ID" in names and len(rest_text) > len(names):
        k = names.index("GPU NUMA ID")
        if k < len(rest_text) and rest_text[k] == "":
            del rest_text[k]
    extra = [c for c in rest_text[len(names):] if c]
    if extra:
        raise ParseError(f"unexpected cells {extra} after the affinity columns", hint=_HINT_RECAPTURE,
                         where=where)
    rest_text = rest_text[:len(names)]
    return tuple(rest_text + [""] * (len(names) - len(rest_text)))


@dataclass
class _Rows:
    cells: list[tuple[str, ...]]
    infos: list[tuple[str, ...]]
    line_numbers: list[int]
    end: int  # index of the first line after the matrix


def _read_rows(lines: list[_Line], start: int, devices: list[str], info_names: list[str],
               source: str) -> _Rows:
    rows: list[tuple[str, ...]] = []
    infos: list[tuple[str, ...]] = []
    numbers: list[int] = []
    pos = start
    for expected in devices:
        while pos < len(lines) and (not lines[pos].text.strip() or set(lines[pos].text.strip()) <= set("|-: ")):
            pos += 1  # blank lines, and a markdown table's |---| rule
        if pos >= len(lines):
            last = (numbers[-1] if numbers else lines[start - 1].number) + 1  # where the row should be
            raise ParseError(
                f"the matrix is cut: the row for {expected} is missing (the header lists "
                f"{len(devices)} devices, {len(rows)} rows were found)", hint=_HINT_RECAPTURE,
                where=f"{source}:{last}")
        line = lines[pos]
        where = f"{source}:{line.number}"
        cells = line.cells() if line.layout != "spaces" else line.tokens()
        label = cells[0].text if cells else ""
        if label != expected:
            found = label or line.text.strip()[:40]
            raise ParseError(f"expected the row for {expected}, found {found!r}: the matrix is incomplete "
                             "or garbled", hint=_HINT_RECAPTURE, where=where)
        values = [c.text for c in cells[1:1 + len(devices)]]
        if len(values) < len(devices) or any(not v for v in values):
            raise ParseError(f"row {expected} has {sum(1 for v in values if v)} matrix cells, the header has "
                             f"{len(devices)} device columns (a cell or TAB is missing)", hint=_HINT_RECAPTURE,
                             where=where)
        for column, value in zip(devices, values, strict=True):
            if not _is_link_label(value):
                raise ParseError(f"cell {value!r} in column {column} of row {expected} is not a topology label "
                                 "(X, NV#, PIX, PXB, PHB, NODE, SYS): the paste looks garbled",
                                 hint=_HINT_RECAPTURE, where=where)
        rows.append(tuple(values))
        infos.append(_row_info_values(line, cells, len(devices), info_names, where))
        numbers.append(line.number)
        pos += 1
    return _Rows(rows, infos, numbers, pos)


def _check_matrix(rows: list[tuple[str, ...]], devices: list[str], row_lines: list[int], source: str) -> None:
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            cls, _ = parse_link_label(value)
            if (i == j) != (cls is LinkClass.SELF):
                what = "the diagonal must be X" if i == j else "X off the diagonal"
                raise ParseError(f"row {devices[i]}, column {devices[j]} is {value!r}: {what}",
                                 hint=_HINT_RECAPTURE, where=f"{source}:{row_lines[i]}")
            if j < i and rows[j][i] != value:
                raise ParseError(
                    f"the matrix is not symmetric: {devices[i]}->{devices[j]} is {value} but "
                    f"{devices[j]}->{devices[i]} is {rows[j][i]} (a garbled paste?)",
                    hint=_HINT_RECAPTURE, where=f"{source}:{row_lines[i]}")


def _read_legend(lines: list[_Line], pos: int, source: str) -> tuple[set[str], dict[str, str], bool]:
    entries: set[str] = set()
    nic_names: dict[str, str] = {}
    saw_legend = False
    for line in lines[pos:]:
        text = line.text.strip()
        if re.fullmatch(r"(?i)legend\s*:?", text):
            saw_legend = True
        elif m := _LEGEND_ENTRY.match(line.text):
            entries.add(m.group(1))
            saw_legend = True
        elif m := _NIC_LEGEND_ENTRY.match(line.text):
            nic_names[m.group(1)] = m.group(2)
        elif _looks_like_row(line):
            raise ParseError(f"a matrix row after the matrix ({line.tokens()[0].text!r} is not in the header)",
                             hint=_HINT_RECAPTURE, where=f"{source}:{line.number}")
    return entries, nic_names, saw_legend


def parse_topo_matrix(text: str, source: str = "<topo -m>") -> TopoMatrix:
    """Parse one ``nvidia-smi topo -m`` output. ``source`` names it in errors (a file name)."""
    lines = _clean_lines(text)
    head = _find_header(lines, source)
    header = lines[head]
    devices, info_cols = _split_header(header, source)
    read = _read_rows(lines, head + 1, devices, [t.text for t in info_cols], source)
    rows, infos = read.cells, read.infos
    _check_matrix(rows, devices, read.line_numbers, source)
    entries, nic_legend, saw_legend = _read_legend(lines, read.end, source)

    gpus = [d for d in devices if _GPU_LABEL.fullmatch(d)]
    nics = devices[len(gpus):]
    warnings: list[str] = []
    nic_names: list[str | None] = []
    for label in nics:
        nic_names.append(nic_legend.get(label) if _NICN_LABEL.fullmatch(label) else label)
    unnamed = [label for label, name in zip(nics, nic_names, strict=True) if name is None]
    if unnamed and not nic_legend:
        warnings.append(f"NIC names unknown: the paste has no NIC Legend ({', '.join(unnamed)} are column "
                        "labels only; the legend may have been cut)")
    elif unnamed:
        warnings.append(f"NIC Legend has no entry for {', '.join(unnamed)}: their names are unknown")
    has_nv_cells = any(parse_link_label(v)[0] is LinkClass.NVLINK for row in rows for v in row)
    legend = "legacy" if "SOC" in entries else "modern" if entries else "none"
    if legend == "modern" and "NV#" not in entries and not has_nv_cells and len(gpus) > 1:
        warnings.append("NVLink not shown: the legend has no NV# line, as printed by `nvidia-smi topo -mp`; "
                        "GPU-GPU cells are PCIe paths even where NVLink exists")
    if not saw_legend:
        warnings.append("no legend in the paste (it may have been cut); labels read with their standard meaning")
    info_names = tuple(t.text for t in info_cols)
    _affinity_warnings(gpus, infos, info_names, warnings)
    return TopoMatrix(source, header.layout, tuple(gpus), tuple(nics), tuple(nic_names),
                      tuple(rows), info_names, tuple(infos[:len(gpus)]), legend, tuple(warnings))


def _affinity_warnings(gpus: list[str], infos: list[tuple[str, ...]], names: tuple[str, ...],
                       warnings: list[str]) -> None:
    if "NUMA Affinity" not in names:
        warnings.append("no NUMA Affinity column (older driver): the GPUs' NUMA nodes are unknown")
    if "CPU Affinity" in names:
        k = names.index("CPU Affinity")
        empty = [g for g, info in zip(gpus, infos[:len(gpus)], strict=True) if not info[k]]
        if empty:
            warnings.append(f"CPU Affinity is empty for {', '.join(empty)}: their CPUs are outside the cpuset "
                            "nvidia-smi ran in (e.g. a Slurm job)")
    if "NUMA Affinity" in names:
        k = names.index("NUMA Affinity")
        odd = sorted({info[k] for info in infos[:len(gpus)] if not info[k].isdigit()})
        if odd:
            warnings.append(f"NUMA Affinity {', '.join(repr(v) for v in odd)} is not a single node: those "
                            "GPUs' NUMA nodes are unknown")


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def node_from_topo_matrix(topo: TopoMatrix, hostname: str = "") -> Node:
    """The :class:`Node` a topo matrix describes (no names, bus ids or memory: topo -m lacks them)."""
    gpus = []
    for pos, label in enumerate(topo.gpu_labels):
        affinity_text = topo.info_value(pos, "CPU Affinity")
        try:
            affinity = parse_cpu_list(affinity_text) if affinity_text else None
        except ValueError as exc:
            raise ParseError(f"{label}: CPU Affinity {affinity_text!r} is not a CPU list", hint=str(exc),
                             where=topo.source) from None
        match = _GPU_LABEL.fullmatch(label)
        assert match is not None
        gpus.append(Gpu(index=int(match.group(1)), numa_node=_int_or_none(topo.info_value(pos, "NUMA Affinity")),
                        cpu_affinity=affinity,
                        memory_numa_node=_int_or_none(topo.info_value(pos, "GPU NUMA ID"))))
    nics = tuple(Nic(label=label, name=name) for label, name in zip(topo.nic_labels, topo.nic_names, strict=True))
    return Node(hostname=hostname or topo.source, gpus=tuple(gpus), nics=nics, matrix=topo.matrix,
                source="nvidia-smi topo -m", missing=topo.warnings)
