"""NCCL topology XML (``NCCL_TOPO_FILE``): read it as NCCL does, write it as NCCL reads it.

NCCL's parser (``src/graph/xml.cc``) is hand-written and stricter than XML: one space between
attributes, every start tag on one line, only spaces and newlines between elements, no prolog, no
text content, names and values under 254 characters, at most 16 attributes and 256 known elements.
:func:`parse_nccl_xml` applies the same rules and raises :class:`~fstrain.errors.ParseError` with
the line where NCCL would fail, so a file that reads here also loads in NCCL. :func:`render_nccl_xml`
writes what NCCL's own dump writes (2-space indent, attributes in order, ``/>`` for leaves).
:func:`node_from_nccl_xml` reads a topology file into the :class:`~fstrain.core.topo.topology.Node` model.
See ``../shared/fixtures/nccl-xml/FORMAT.md`` for the rules and where each comes from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from fstrain.core.topo.topology import Gpu, Nic, Node
from fstrain.errors import ParseError

MAX_STR_LEN = 255  # a name or value of 254 characters or more is fatal in NCCL
MAX_ATTRS = 16  # further attributes are dropped by NCCL
MAX_NODES = 256  # known elements in one topology file
# The handler table of NCCL's topology loader: which element NCCL reads under which parent.
CHILDREN: dict[str, tuple[str, ...]] = {
    "": ("system",),
    "system": ("cpu",),
    "cpu": ("pci", "nic"),
    "pci": ("pci", "gpu", "nic", "pcilink"),
    "gpu": ("nvlink", "c2c"),
    "nic": ("net",),
}
# nvidia-smi / NCCL link speed strings -> PCIe generation (NCCL prefix-matches these).
LINK_SPEED_GENERATION = {"2.5 GT/s": 1, "5 GT/s": 2, "5.0 GT/s": 2, "8 GT/s": 3, "8.0 GT/s": 3,
                         "16 GT/s": 4, "16.0 GT/s": 4, "32 GT/s": 5, "32.0 GT/s": 5, "64 GT/s": 6, "64.0 GT/s": 6}
NVSWITCH_CLASS = "0x068000"
CPU_CLASS = "0x068001"
NO_TARGET = "fffffff:ffff:ff"  # NCCL's "remote end not visible" sentinel


@dataclass
class XmlElement:
    """One element with its attributes in order; ``comment`` is written as ``<!-- -->`` before it."""

    name: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[XmlElement] = field(default_factory=list)
    line: int = 0
    comment: str = ""

    def iter(self, name: str) -> Iterator[XmlElement]:
        """Every descendant (not self) called ``name``, in document order."""
        for child in self.children:
            if child.name == name:
                yield child
            yield from child.iter(name)

    def subs(self, name: str) -> list[XmlElement]:
        return [c for c in self.children if c.name == name]


class _Eof(Exception):
    pass


class _Reader:
    """A port of NCCL's character-level XML tokenizer, with line numbers for the errors."""

    def __init__(self, text: str, source: str) -> None:
        self.text, self.source, self.pos = text, source, 0

    @property
    def line(self) -> int:
        return self.text.count("\n", 0, self.pos) + 1

    def fail(self, message: str, hint: str = "", line: int | None = None) -> ParseError:
        where = f"{self.source}:{line or self.line}"
        return ParseError(message, hint=hint or "NCCL would refuse this file", where=where)

    def getc(self) -> str:
        if self.pos >= len(self.text):
            raise _Eof
        c = self.text[self.pos]
        self.pos += 1
        return c

    def value(self) -> tuple[str, str]:
        quote = self.getc()
        if quote not in "\"'":
            raise self.fail("attribute value without quotes", "write key=\"value\"")
        start = self.pos
        end = self.text.find(quote, start)
        if end < 0:
            raise _Eof
        if end - start + 1 >= MAX_STR_LEN - 1:
            raise self.fail(f"value of {end - start} characters: NCCL stops at {MAX_STR_LEN - 2}")
        self.pos = end + 1
        return self.text[start:end], self.getc()

    def token(self, want_value: bool) -> tuple[str, str | None, str]:
        """(name, value or None, the character that ended it), as NCCL's xmlGetToken."""
        chars: list[str] = []
        while True:
            c = self.getc()
            if c == "=":
                name = "".join(chars)
                if not want_value:
                    raise self.fail(f"unexpected value with name {name!r}",
                                    "put a space after <!-- in comments; no attributes in closing tags")
                value, last = self.value()
                return name, value, last
            if c in " >/\n\r":
                return "".join(chars), None, c
            chars.append(c)
            if len(chars) >= MAX_STR_LEN - 1:
                raise self.fail(f"name {''.join(chars)[:40]!r}... too long")

    def node(self) -> tuple[str, XmlElement | None, str]:
        """('open'|'single'|'close'|'none', element, closing name)."""
        c = " "
        while c in " \n\r":
            if self.pos >= len(self.text):
                return "none", None, ""
            c = self.getc()
        if c != "<":
            shown = "TAB" if c == "\t" else "a byte-order mark" if c == "\ufeff" else repr(c)
            raise self.fail(f"expecting '<', got {shown}", "indent with spaces only; no text between elements")
        line = self.line
        start = self.pos
        name, _, c = self.token(False)
        if name.startswith("?"):
            raise self.fail("an XML prolog (<?xml ...?>) is rejected by NCCL", "delete the first line")
        if name.startswith("!--"):  # a comment: NCCL skips to the next "-->"
            end = self.text.find("-->", start + 3)
            if end < 0:
                raise self.fail("unterminated comment")
            self.pos = end + 3
            return self.node()
        if name == "" and c == "/":
            closing, _, c = self.token(False)
            if c != ">":
                raise self.fail(f"unexpected {c!r} in closing tag {closing}", f"write </{closing}>")
            return "close", None, closing
        element = XmlElement(name, line=line)
        count = 0
        while c == " ":
            key, value, c = self.token(True)
            count += 1
            if count <= MAX_ATTRS:
                element.attrs[key] = value if value is not None else ""
        if count > MAX_ATTRS:
            element.attrs["!dropped"] = str(count - MAX_ATTRS)
        kind = "open"
        if c == "/":
            kind = "single"
            _, _, c = self.token(False)
        if c != ">":
            shown = "a newline" if c in "\r\n" else repr(c)
            raise self.fail(f"expected '>' in <{name}>, got {shown}", "keep every start tag on one line", line)
        return kind, element, ""


def parse_nccl_xml(text: str, source: str = "<nccl xml>") -> tuple[XmlElement, tuple[str, ...]]:
    """Parse an NCCL topology file as NCCL 2.30 does; return the ``system`` root and warnings.

    Warnings name what NCCL silently drops: unknown or misplaced elements, extra attributes.
    """
    reader = _Reader(text, source)
    warnings: list[str] = []
    top = XmlElement("")
    known = [0]

    def load(head: XmlElement, kind: str, allowed: tuple[str, ...]) -> None:
        if kind == "single":
            return
        while True:
            try:
                node_kind, element, closing = reader.node()
            except _Eof:
                raise reader.fail(f"unterminated <{head.name}>" if head.name else "unexpected end of file",
                                  line=head.line or None) from None
            if node_kind == "none":
                if head.name:
                    raise reader.fail(f"unterminated <{head.name}>: the file ends before </{head.name}>",
                                      line=head.line)
                return
            if node_kind == "close":
                if closing != head.name:
                    raise reader.fail(f"closing </{closing}> does not match <{head.name}>" if head.name
                                      else f"closing </{closing}> without an opening tag")
                return
            assert element is not None
            if "!dropped" in element.attrs:
                warnings.append(f"{source}:{element.line}: <{element.name}> has more than {MAX_ATTRS} attributes; "
                                f"NCCL drops {element.attrs.pop('!dropped')}")
            head.children.append(element)
            if element.name in allowed:
                known[0] += 1
                if known[0] > MAX_NODES:
                    raise reader.fail(f"more than {MAX_NODES} elements: NCCL's parser stops there")
                load(element, node_kind, CHILDREN.get(element.name, ()))
            else:
                if allowed and head.name != "":
                    warnings.append(f"{source}:{element.line}: NCCL ignores <{element.name}> inside <{head.name}> "
                                    "(with everything in it)")
                load(element, node_kind, ())

    load(top, "open", CHILDREN[""])
    roots = [c for c in top.children if c.name != "!--"]
    if roots and roots[0].name == "graphs":
        raise ParseError("this is an NCCL graph file (NCCL_GRAPH_FILE), not a topology file", where=source,
                         hint="pass a file whose root is <system version=\"1\">")
    if not roots or roots[0].name != "system":
        raise ParseError("no <system> element: not an NCCL topology file", where=source,
                         hint="the root must be <system version=\"1\">")
    if len(roots) > 1:
        raise ParseError(f"{len(roots)} top-level elements; NCCL expects one <system>",
                         where=f"{source}:{roots[1].line}", hint="merge them into one <system>")
    system = roots[0]
    if system.attrs.get("version") != "1":
        raise ParseError(f"<system version={system.attrs.get('version')!r}>: NCCL needs version=\"1\"",
                         where=f"{source}:{system.line}", hint="RCCL files (version 2) do not load in NCCL")
    return system, tuple(warnings)


def check_value(value: str, what: str) -> None:
    """Raise ValueError for a value NCCL cannot read back."""
    if '"' in value or "\n" in value or "\t" in value:
        raise ValueError(f"{what}: {value!r} holds a quote, TAB or newline")
    if len(value) >= MAX_STR_LEN - 1:
        raise ValueError(f"{what}: {len(value)} characters, NCCL reads at most {MAX_STR_LEN - 2}")


def render_nccl_xml(root: XmlElement) -> str:
    """Write ``root`` as NCCL's own dump does; raise ValueError for what NCCL could not read."""
    lines: list[str] = []

    def emit(element: XmlElement, depth: int) -> None:
        pad = "  " * depth
        if element.comment:  # NCCL skips comments whole: no length limit, but no "--" inside
            if "--" in element.comment or "\n" in element.comment:
                raise ValueError(f"comment {element.comment!r} holds '--' or a newline")
            lines.append(f"{pad}<!-- {element.comment} -->")
        if len(element.attrs) > MAX_ATTRS:
            raise ValueError(f"<{element.name}> has {len(element.attrs)} attributes, NCCL keeps {MAX_ATTRS}")
        attrs = ""
        for key, value in element.attrs.items():
            check_value(key, f"<{element.name}> attribute name")
            check_value(value, f"<{element.name} {key}>")
            attrs += f' {key}="{value}"'
        if not element.children:
            lines.append(f"{pad}<{element.name}{attrs}/>")
            return
        lines.append(f"{pad}<{element.name}{attrs}>")
        for child in element.children:
            emit(child, depth + 1)
        lines.append(f"{pad}</{element.name}>")

    emit(root, 0)
    return "\n".join(lines) + "\n"


# --- NCCL XML -> topology model ----------------------------------------------------------------


def parse_cpumap(mask: str) -> tuple[int, ...]:
    """``"ffff,fff00000"`` (sysfs cpumap: 32-bit hex groups, most significant first) -> CPU ids."""
    cpus: list[int] = []
    for group_index, group in enumerate(reversed(mask.split(","))):
        value = int(group, 16) if group else 0
        cpus.extend(group_index * 32 + bit for bit in range(32) if value >> bit & 1)
    return tuple(cpus)


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text not in (None, "") else None  # NCCL reads with strtol(.., 0)
    except ValueError:
        return None


def link_speed_generation(link_speed: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4; None for an empty or unknown speed (NCCL then assumes Gen3)."""
    if not link_speed:
        return None
    head = " ".join(link_speed.split()[:2])
    return LINK_SPEED_GENERATION.get(head)


@dataclass(frozen=True)
class _Placed:
    """A GPU or NIC with its place in the tree: CPU numaid and the pci busids above it."""

    numaid: str
    ancestors: tuple[str, ...]  # pci busids from the CPU down, the device's own pci excluded
    own: str | None  # the device's own pci busid (None for a NIC directly under the CPU)


def _pcie_label(a: _Placed, b: _Placed) -> str:
    if a.numaid != b.numaid:
        return "SYS"
    if a.own is not None and a.own == b.own:
        return "PIX"  # two ports of one NIC
    common = 0
    while common < min(len(a.ancestors), len(b.ancestors)) and a.ancestors[common] == b.ancestors[common]:
        common += 1
    if common == 0:
        return "PHB"  # NCCL has no NODE level: anything through the CPU of one NUMA node is PHB
    return "PIX" if common == len(a.ancestors) == len(b.ancestors) else "PXB"


def _walk(element: XmlElement, numaid: str, chain: tuple[str, ...]) -> Iterator[tuple[XmlElement, _Placed]]:
    """Yield every pci and nic element with its placement."""
    for child in element.children:
        if child.name == "pci":
            busid = child.attrs.get("busid", "")
            yield child, _Placed(numaid, chain, busid)
            yield from _walk(child, numaid, (*chain, busid))
        elif child.name == "nic" and not chain:  # a NIC under a pci is read with its pci
            yield child, _Placed(numaid, chain, None)


def node_from_nccl_xml(system: XmlElement, hostname: str = "", source: str = "<nccl xml>") -> Node:
    """The GPUs, NICs and links an NCCL topology file describes, in NCCL's view of them.

    Link labels follow NCCL, not nvidia-smi: no NODE level (PHB instead), PCIe classes from the
    switch tree, NVLink widths from ``<nvlink count>``.
    """
    gpus: list[tuple[Gpu, _Placed, XmlElement]] = []
    nics: list[tuple[Nic, _Placed]] = []
    missing: list[str] = []
    unnamed_gpus = 0
    for cpu in system.subs("cpu"):
        numaid = cpu.attrs.get("numaid", "-1")
        numa = _int(numaid)
        affinity = parse_cpumap(cpu.attrs["affinity"]) if cpu.attrs.get("affinity") else None
        for element, placed in _walk(cpu, numaid, ()):
            if element.name == "nic":
                for net in element.subs("net"):
                    nics.append((_nic(net, None, numa), placed))
                continue
            klass = element.attrs.get("class", "")
            gpu_elements = element.subs("gpu")
            if gpu_elements or klass.startswith("0x03"):
                gpu_el = gpu_elements[0] if gpu_elements else XmlElement("gpu")
                dev = _int(gpu_el.attrs.get("dev"))
                if dev is None:
                    unnamed_gpus += 1
                sm = gpu_el.attrs.get("sm")
                gpus.append((Gpu(
                    index=dev if dev is not None else -1, pci_bus_id=placed.own, numa_node=numa if numa is not None
                    and numa >= 0 else None, cpu_affinity=affinity,
                    compute_capability=f"{int(sm) // 10}.{int(sm) % 10}" if sm and sm.isdigit() else None,
                    pcie_generation=link_speed_generation(element.attrs.get("link_speed")),
                    pcie_width=_int(element.attrs.get("link_width")) or None), placed, gpu_el))
            nic_elements = element.subs("nic")
            for nic_el in nic_elements:
                for net in nic_el.subs("net"):
                    nics.append((_nic(net, placed.own, numa), placed))
            if klass.startswith("0x02") and not nic_elements:
                nics.append((Nic(label=f"NIC{len(nics)}", pci_bus_id=placed.own, numa_node=numa), placed))
                missing.append(f"NIC at {placed.own} has no <net>: its name is unknown")
    if unnamed_gpus:
        # CUDA and NVML number GPUs in PCI bus order, so that is the best guess for a template.
        missing.append(f"{unnamed_gpus} GPU(s) without <gpu dev>: indices follow PCI bus order")
        ordered = sorted(range(len(gpus)), key=lambda i: gpus[i][0].pci_bus_id or "")
        gpus = [(replace(gpus[i][0], index=rank), gpus[i][1], gpus[i][2]) for rank, i in enumerate(ordered)]
    gpus.sort(key=lambda g: g[0].index)
    seen: set[str] = set()
    for pos, (nic, place) in enumerate(nics):  # labels must be unique: suffix repeated names
        label, k = nic.label, 1
        while label in seen:
            label, k = f"{nic.label}#{k}", k + 1
        seen.add(label)
        nics[pos] = (replace(nic, label=label), place)
    matrix, nvswitch, notes = _matrix(gpus, nics, source)
    missing.extend(notes)
    return Node(hostname=hostname or system.attrs.get("name", source), gpus=tuple(g for g, _, _ in gpus),
                nics=tuple(n for n, _ in nics), matrix=matrix, source="NCCL topology XML",
                missing=tuple(missing), nvswitch=nvswitch)


def _nic(net: XmlElement, busid: str | None, numa: int | None) -> Nic:
    name = net.attrs.get("name") or None
    speed = _int(net.attrs.get("speed"))
    return Nic(label=name or "NIC?", name=name, pci_bus_id=busid,
               numa_node=numa if numa is not None and numa >= 0 else None,
               rate_gbps=speed / 1000 if speed and speed > 0 else None)


def _matrix(gpus: list[tuple[Gpu, _Placed, XmlElement]], nics: list[tuple[Nic, _Placed]],
            source: str) -> tuple[tuple[tuple[str, ...], ...], bool | None, list[str]]:
    by_bus = {g.pci_bus_id: g.index for g, _, _ in gpus}
    direct: dict[tuple[int, int], int] = {}
    switch: dict[int, int] = {}
    notes: list[str] = []
    saw_nvlink = False
    for gpu, _, element in gpus:
        for link in element.subs("nvlink"):
            saw_nvlink = True
            count = _int(link.attrs.get("count")) or 0
            tclass = link.attrs.get("tclass", NVSWITCH_CLASS)
            target = link.attrs.get("target", "")
            if tclass.startswith("0x03"):
                if target == gpu.pci_bus_id:
                    notes.append(f"GPU{gpu.index}: <nvlink> target is the GPU's own bus id ({source}:{link.line})")
                elif target in by_bus:
                    key = (min(gpu.index, by_bus[target]), max(gpu.index, by_bus[target]))
                    direct[key] = max(direct.get(key, 0), count)
            elif tclass == NVSWITCH_CLASS:
                switch[gpu.index] = switch.get(gpu.index, 0) + count
    placed = [(f"GPU{g.index}", p, g.index) for g, p, _ in gpus] + [(n.label, p, None) for n, p in nics]
    rows: list[tuple[str, ...]] = []
    for i, (_, a_place, a_gpu) in enumerate(placed):
        row: list[str] = []
        for j, (_, b_place, b_gpu) in enumerate(placed):
            if i == j:
                row.append("X")
                continue
            lanes = 0
            if a_gpu is not None and b_gpu is not None:
                lanes = direct.get((min(a_gpu, b_gpu), max(a_gpu, b_gpu)), 0)
                lanes += min(switch.get(a_gpu, 0), switch.get(b_gpu, 0))
            row.append(f"NV{lanes}" if lanes else _pcie_label(a_place, b_place))
        rows.append(tuple(row))
    return tuple(rows), (bool(switch) if saw_nvlink else None), notes


def read_nccl_topology(text: str, source: str = "<nccl xml>", hostname: str = "") -> tuple[Node, tuple[str, ...]]:
    """Parse an NCCL topology file into a Node; also return NCCL's silent-drop warnings."""
    system, warnings = parse_nccl_xml(text, source)
    return node_from_nccl_xml(system, hostname, source), warnings
