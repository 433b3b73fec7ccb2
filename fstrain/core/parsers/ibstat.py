"""Parse ``ibstat``, ``ibstatus`` and ``ibv_devinfo`` into RDMA devices and ports.

The probe reads ``/sys/class/infiniband`` directly; these parsers read the same facts from the
tools' text, for pastes and for hosts where only the tools' output is at hand. The sysfs spellings
(``4: ACTIVE``, ``400 Gb/sec (4X NDR)``) go through the same helpers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fstrain.errors import ParseError


@dataclass(frozen=True)
class IbPort:
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED ...
    physical_state: str | None = None  # LinkUp, Disabled, Polling ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand / Ethernet
    lid: int | None = None


@dataclass(frozen=True)
class IbDevice:
    name: str
    ports: tuple[IbPort, ...]
    ca_type: str | None = None  # MT4129 = ConnectX-7
    firmware: str | None = None
    node_guid: str | None = None  # 0x-prefixed, lowercase hex
    system_image_guid: str | None = None

    @property
    def active_ports(self) -> tuple[IbPort, ...]:
        return tuple(p for p in self.ports if p.state == "ACTIVE")


_STATE_WORD = re.compile(r"(?:\d+:\s*)?(?:PORT_)?([A-Za-z_]+)(?:\s*\(\d+\))?")


def normalize_port_state(text: str) -> str:
    """``Active``, ``4: ACTIVE`` (sysfs, ibstatus) and ``PORT_ACTIVE (4)`` (ibv_devinfo) -> ``ACTIVE``."""
    match = _STATE_WORD.fullmatch(text.strip())
    return (match.group(1) if match else text.strip()).upper()


def normalize_physical_state(text: str) -> str:
    """``5: LinkUp`` (sysfs, ibstatus) -> ``LinkUp``."""
    return re.sub(r"^\d+:\s*", "", text.strip())


def parse_rate_gbps(text: str) -> float | None:
    """``400``, ``200 Gb/sec (4X HDR)``, ``56`` -> the rate in Gbit/s; None for anything else."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def normalize_guid(text: str) -> str:
    """``0x98039b0300dccab0`` or ``9803:9b03:00dc:cab0`` (sysfs, ibv_devinfo) -> ``0x98039b0300dccab0``."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not re.fullmatch(r"[0-9a-f]{1,16}", digits):
        raise ValueError(f"not a GUID: {text!r}")
    return "0x" + digits.rjust(16, "0")


def _kv(line: str) -> tuple[str, str] | None:
    key, sep, value = line.strip().partition(":")
    return (key.strip(), value.strip()) if sep else None


def _guid_or_none(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return normalize_guid(value)
    except ValueError:
        return None


def parse_ibstat(text: str, source: str = "<ibstat>") -> tuple[IbDevice, ...]:
    """``ibstat``: ``CA 'mlx5_0'`` blocks with ``Port N:`` sub-blocks."""
    devices: list[IbDevice] = []
    current: dict[str, str] | None = None
    ports: list[dict[str, str]] = []

    def flush() -> None:
        if current is not None:
            devices.append(IbDevice(
                name=current["name"], ca_type=current.get("CA type"), firmware=current.get("Firmware version"),
                node_guid=_guid_or_none(current.get("Node GUID")),
                system_image_guid=_guid_or_none(current.get("System image GUID")),
                ports=tuple(_port(p) for p in ports)))

    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if match := re.fullmatch(r"CA '([^']+)'\s*", line):
            flush()
            current, ports = {"name": match.group(1)}, []
        elif match := re.fullmatch(r"\s+Port (\d+):\s*", line):
            if current is None:
                raise ParseError("a Port block before any CA line", where=f"{source}:{number}")
            ports.append({"port": match.group(1)})
        elif (kv := _kv(line)) is not None and current is not None:
            (ports[-1] if ports and line.startswith(("\t\t", "        ")) else current)[kv[0]] = kv[1]
        else:
            raise ParseError(f"unexpected line {line.strip()[:60]!r}", hint="pass the output of `ibstat`",
                             where=f"{source}:{number}")
    flush()
    return tuple(devices)


def _port(fields: dict[str, str]) -> IbPort:
    state = fields.get("State") or fields.get("state")
    phys = fields.get("Physical state") or fields.get("phys state")
    rate = fields.get("Rate") or fields.get("rate")
    lid = fields.get("Base lid") or fields.get("base lid") or fields.get("port_lid")
    return IbPort(
        port=int(fields["port"]),
        state=normalize_port_state(state) if state else None,
        physical_state=normalize_physical_state(phys) if phys else None,
        rate_gbps=parse_rate_gbps(rate) if rate else None,
        link_layer=fields.get("Link layer") or fields.get("link_layer"),
        lid=int(lid, 0) if lid and re.fullmatch(r"(0x)?[0-9a-fA-F]+", lid) else None,
    )


def parse_ibstatus(text: str, source: str = "<ibstatus>") -> tuple[IbDevice, ...]:
    """``ibstatus``: one ``Infiniband device 'mlx5_0' port 1 status:`` block per port."""
    by_name: dict[str, list[IbPort]] = {}
    fields: dict[str, str] | None = None
    name = ""
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if match := re.fullmatch(r"Infiniband device '([^']+)' port (\d+) status:\s*", line):
            name, fields = match.group(1), {"port": match.group(2)}
        elif not line.strip():
            if fields is not None:
                by_name.setdefault(name, []).append(_port(fields))
                fields = None
        elif (kv := _kv(line)) is not None and fields is not None:
            fields[kv[0]] = kv[1]
        else:
            raise ParseError(f"unexpected line {line.strip()[:60]!r}", hint="pass the output of `ibstatus`",
                             where=f"{source}:{number}")
    return tuple(IbDevice(name=n, ports=tuple(p)) for n, p in by_name.items())


def parse_ibv_devinfo(text: str, source: str = "<ibv_devinfo>") -> tuple[IbDevice, ...]:
    """``ibv_devinfo``: ``hca_id:`` blocks with ``port:`` sub-blocks (no rate in this output)."""
    devices: list[IbDevice] = []
    current: dict[str, str] | None = None
    ports: list[dict[str, str]] = []

    def flush() -> None:
        if current is not None:
            devices.append(IbDevice(
                name=current["hca_id"], ca_type=current.get("vendor_part_id"), firmware=current.get("fw_ver"),
                node_guid=_guid_or_none(current.get("node_guid")),
                system_image_guid=_guid_or_none(current.get("sys_image_guid")),
                ports=tuple(_port(p) for p in ports)))

    for number, line in enumerate(text.splitlines(), 1):
        kv = _kv(line)
        if not line.strip():
            continue
        if kv is None:
            raise ParseError(f"unexpected line {line.strip()[:60]!r}", hint="pass the output of `ibv_devinfo`",
                             where=f"{source}:{number}")
        key, value = kv
        if key == "hca_id":
            flush()
            current, ports = {"hca_id": value}, []
        elif current is None:
            raise ParseError(f"{key!r} before any hca_id line", where=f"{source}:{number}")
        elif key == "port":
            ports.append({"port": value})
        else:
            (ports[-1] if ports else current)[key] = value
    flush()
    return tuple(devices)


def parse_ib_text(text: str, source: str = "<ib tool output>") -> tuple[IbDevice, ...]:
    """Whichever of ``ibstat``, ``ibstatus`` or ``ibv_devinfo`` the text is."""
    head = text.lstrip()
    if head.startswith("CA '"):
        return parse_ibstat(text, source)
    if head.startswith("Infiniband device '"):
        return parse_ibstatus(text, source)
    if head.startswith("hca_id:"):
        return parse_ibv_devinfo(text, source)
    raise ParseError("not ibstat, ibstatus or ibv_devinfo output", hint="pass one of those tools' output",
                     where=source)
