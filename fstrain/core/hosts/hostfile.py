"""Host inventory: DeepSpeed hostfiles, plain host lists, Slurm host lists, include/exclude.

Pure: takes text and returns values. Every error names where it came from (``file:line`` or the
flag) and says how to fix it.

Forms understood:

- DeepSpeed hostfile lines ``worker-1 slots=8`` (tokens after ``slots=N`` are ignored, as
  DeepSpeed does), ``#`` comments and blank lines;
- the marker ``spare=true`` after the host name (``worker-9 slots=8 spare=true``): a spare host,
  kept out of the first world and ready to take an excluded host's place (:func:`split_spares`,
  :func:`pick_replacements`);
- plain lists, one host per line, whose slots come from ``--gpus-per-node`` or a probe;
- Slurm compressed lists ``node[01-04,07]``, ``rack[1-2]-n[01-02]`` (zero padding kept);
- ``user@host``, ``host:port`` and ``[v6addr]:port``;
- DeepSpeed ``--include``/``--exclude`` filters ``host1:0,1@host2`` where a bare host means all of
  its slots.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fstrain.errors import InventoryError

_SLOTS_RE = re.compile(r"^slots=(?P<value>.*)$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$|^[0-9A-Fa-f:.]+$")
MAX_HOSTS = 100_000  # a host list or hostfile naming more is a mistake (or an attack), not a cluster
MAX_SLOTS = 1024  # processes per host; far above any machine, far below what exhausts memory
MAX_LABEL_CHARS = 63  # one DNS label (RFC 1035); the resolver refuses longer ones
MAX_NAME_CHARS = 253


def is_decimal(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts '²', which ``int`` then refuses."""
    return text.isascii() and text.isdigit()


@dataclass(frozen=True)
class Host:
    """One host of the inventory.

    ``name`` is what the user wrote (an SSH alias, a DNS name or an address); ``slots`` is the
    number of processes (GPUs) it runs, ``None`` while unknown; ``slot_ids`` the selected local
    slots after include/exclude, ``None`` meaning all of them; ``where`` says where it was
    defined, for error messages; ``spare`` marks a host held back to replace an excluded one.
    """

    name: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    slot_ids: tuple[int, ...] | None = None
    where: str = ""
    spare: bool = False  # ``spare=true`` in the hostfile: not in the first world, a replacement

    @property
    def num_selected_slots(self) -> int | None:
        """How many processes this host runs after filtering (``None`` while slots are unknown)."""
        if self.slot_ids is not None:
            return len(self.slot_ids)
        return self.slots

    def label(self) -> str:
        """The host as the user wrote it, for messages and output."""
        text = self.name
        if self.user:
            text = f"{self.user}@{text}"
        if self.port is not None:
            host_part = f"[{self.name}]" if ":" in self.name else self.name
            text = f"{self.user + '@' if self.user else ''}{host_part}:{self.port}"
        return text


def parse_host_token(token: str, where: str, slots: int | None = None) -> Host:
    """Parse ``[user@]host[:port]`` (or ``[user@][v6]:port``) into a :class:`Host`."""
    user: str | None = None
    rest = token
    if "@" in rest:
        user, rest = _split_user(token, where)
    port: int | None = None
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise InventoryError(f"unclosed '[' in {token!r}", "write [address]:port", where)
        name, tail = rest[1:close], rest[close + 1 :]
        if tail:
            if not tail.startswith(":"):
                raise InventoryError(f"unexpected {tail!r} after ']' in {token!r}", "write [address]:port", where)
            port = _parse_port(tail[1:], token, where)
    elif rest.count(":") == 1:
        name, port_text = rest.split(":")
        port = _parse_port(port_text, token, where)
    else:
        name = rest  # a bare name, or an IPv6 address without a port
    if not name or not _HOSTNAME_RE.match(name):
        raise InventoryError(
            f"{token!r} is not a host name",
            "use a name, an address, user@host or host:port",
            where,
        )
    _check_name_length(name, token, where)
    return Host(name=name, user=user, port=port, slots=slots, where=where)


# What OpenSSH refuses in a user name given on its command line (ssh.c, since 9.6): it reaches
# ProxyCommand's %r, which a shell runs.
_USER_REFUSED = frozenset("'`\"$\\;&<>|(){}")


def _split_user(token: str, where: str) -> tuple[str, str]:
    """``user@rest``: one '@' (DeepSpeed, pdsh and fstrain read the user up to it), a user and a
    host on either side, no shell metacharacters in the user."""
    user, _, rest = token.partition("@")
    if "@" in rest:
        raise InventoryError(f"{token!r} has more than one '@'",
                             "write user@host; a user name that contains '@' goes in the SSH config (User)", where)
    if not user:
        raise InventoryError(f"empty user name in {token!r}", "write user@host", where)
    if not rest:
        raise InventoryError(f"empty host name in {token!r}", "write user@host", where)
    if user.startswith("-") or not _USER_REFUSED.isdisjoint(user):
        raise InventoryError(f"user name {user!r} in {token!r} starts with '-' or holds a shell metacharacter",
                             "write the user's login name (letters, digits, '.', '_', '-')", where)
    return user, rest


def _check_name_length(name: str, token: str, where: str) -> None:
    if len(name) <= MAX_LABEL_CHARS or ":" in name:  # no label can be too long; or an IPv6 address
        return
    longest = max(name.split("."), key=len)
    if len(longest) > MAX_LABEL_CHARS or len(name) > MAX_NAME_CHARS:
        raise InventoryError(
            f"host name {token[:40]!r}... is too long ({len(longest)} characters in one label, {len(name)} in all)",
            f"DNS allows {MAX_LABEL_CHARS} characters per dot-separated label and {MAX_NAME_CHARS} in all",
            where,
        )


def _parse_port(text: str, token: str, where: str) -> int:
    if not is_decimal(text) or len(text) > 5 or not 0 < int(text) < 65536:
        raise InventoryError(f"port must be 1-65535 in {token!r}, got {text!r}", "write host:port", where)
    return int(text)


def parse_hostfile(text: str, path: str) -> list[Host]:
    """Parse a DeepSpeed hostfile or a plain list of hosts (one per line)."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        spare, rest = _spare_marker(tokens[1:], where)
        slots = _parse_slots(rest, where) if rest else None
        host = parse_host_token(tokens[0], where, slots)
        hosts.append(replace(host, spare=True) if spare else host)
        if len(hosts) > MAX_HOSTS:
            raise InventoryError(f"more than {MAX_HOSTS:,} hosts", "is this really a hostfile?", where)
    if not hosts:
        raise InventoryError("no hosts in hostfile", "add lines like 'worker-1 slots=8'", path)
    check_unique(hosts)
    return hosts


_SPARE_VALUES = {"true": True, "false": False}


def _spare_marker(tokens: list[str], where: str) -> tuple[bool, list[str]]:
    """``spare=true`` (or ``false``) anywhere after the host name: (spare, the other tokens)."""
    spare, rest = False, []
    for token in tokens:
        if token.startswith("spare="):
            value = token.removeprefix("spare=")
            if value.lower() not in _SPARE_VALUES:
                raise InventoryError(f"spare must be true or false, got {value[:20]!r}",
                                     "write 'host slots=N spare=true'", where)
            spare = _SPARE_VALUES[value.lower()]
        else:
            rest.append(token)
    return spare, rest


def _parse_slots(tokens: list[str], where: str) -> int:
    match = _SLOTS_RE.match(tokens[0])
    if match is None:
        if tokens[0] == "slots" or tokens[0].startswith("slots"):
            raise InventoryError(
                f"malformed slots in {' '.join(tokens)!r}", "write slots=N with no spaces around '='", where
            )
        raise InventoryError(
            f"expected 'slots=N' after the host name, got {tokens[0]!r}", "write 'host slots=N'", where
        )
    value = match.group("value")
    if not is_decimal(value):
        raise InventoryError(f"slots must be a positive integer, got {value!r}", "write slots=8", where)
    if int(value) == 0:
        raise InventoryError(
            "slots must be a positive integer, got 0", "remove the line or give slots=1 or more", where
        )
    if len(value) > 6 or int(value) > MAX_SLOTS:
        raise InventoryError(f"slots={value[:12]} is more than {MAX_SLOTS} processes on one host",
                             "give the number of GPUs of the host", where)
    return int(value)


DEFAULT_SSH_PORT = 22


def machine_key(name: str, port: int | None) -> tuple[str, int]:
    """Which machine a host entry reaches, as far as names tell without DNS: the name without
    its case (DNS and ssh's Host patterns ignore it) or a trailing dot, an IP address in one
    canonical form (``fd00:0::5`` is ``fd00::5``), and the port, 22 when none is written."""
    key = name.lower().rstrip(".")
    if key[:1].isdigit() or ":" in key:  # perhaps an address literal (a name such as 1node stays as it is)
        with contextlib.suppress(ValueError):
            key = ipaddress.ip_address(key).compressed
    return key, DEFAULT_SSH_PORT if port is None else port


def check_unique(hosts: Sequence[Host], keys: Sequence[tuple[str, int]] | None = None, after: str = "") -> None:
    """Refuse one machine named twice: it would run two copies of every rank. Two entries are
    one machine when their :func:`machine_key` is the same (``node1``, ``root@node1``,
    ``NODE1`` and ``node1:22`` are one; ``gw:2201`` and ``gw:2202`` are two), or their ``keys``
    where given (the HostName and Port the SSH config resolves each to, ``after`` saying so).
    The user does not matter: two logins on one machine share its GPUs."""
    seen: dict[tuple[str, int], Host] = {}
    for index, host in enumerate(hosts):
        key = machine_key(host.name, host.port) if keys is None else keys[index]
        first = seen.get(key)
        if first is not None:
            at = f" at {first.where}" if first.where and first.where != host.where else ""
            raise InventoryError(
                f"duplicate host {host.label()!r}: the same machine as {first.label()!r}{at} "
                f"({key[0]}, port {key[1]}{after})",
                "list each machine once and raise its slots instead",
                host.where,
            )
        seen[key] = host


def expand_hostlist(expr: str, where: str = "--hosts") -> list[str]:
    """Expand a Slurm compressed host list: ``node[01-03,07],gpu-a`` -> node01..node03, node07, gpu-a.

    Several bracket groups multiply in Slurm's order, so node ranks follow the allocation's:
    the last group varies fastest, then the first, the second, ...: ``rack[1-2]-n[01-02]`` gives
    rack1-n01, rack1-n02, rack2-n01, rack2-n02 and ``a[1-2]b[1-2]c[1-2]`` gives a1b1c1, a1b1c2,
    a2b1c1, a2b1c2, a1b2c1, ... Zero padding is kept as written.
    """
    names: list[str] = []
    for item in _split_top_level(expr, where):
        names.extend(_expand_item(item, where))
        if len(names) > MAX_HOSTS:
            raise InventoryError(f"host list expands to more than {MAX_HOSTS:,} hosts",
                                 "check the ranges", where)
    return names


_LIST_SPECIAL_RE = re.compile(r"[\[\], \n\t]")


def _split_top_level(expr: str, where: str) -> list[str]:
    items: list[str] = []
    depth = 0
    start = 0  # where the current item began
    for special in _LIST_SPECIAL_RE.finditer(expr):  # a step per bracket or separator, not per character
        char, at = special.group(), special.start()
        if char == "[":
            depth += 1
            if depth > 1:
                raise InventoryError(f"nested '[' in host list {expr!r}", "write node[01-04]", where)
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise InventoryError(f"unmatched ']' in host list {expr!r}", "write node[01-04]", where)
        elif depth == 0:
            if at > start:
                items.append(expr[start:at])
            start = at + 1
    if depth != 0:
        raise InventoryError(f"unclosed '[' in host list {expr!r}", "write node[01-04]", where)
    if start < len(expr):
        items.append(expr[start:])
    if not items:
        raise InventoryError("empty host list", "give hosts like node[01-04] or a,b,c", where)
    return items


def _expand_item(item: str, where: str) -> list[str]:
    """One comma-free item: its bracket groups multiply in Slurm's order (see expand_hostlist)."""
    texts: list[str] = []  # literal text before each bracket group, then the tail
    groups: list[list[str]] = []
    rest = item
    while (start := rest.find("[")) >= 0:
        end = rest.index("]", start)
        body = rest[start + 1 : end]
        if ":" in body:  # an IPv6 literal such as [fd00::5]:22, not a range
            texts.append(rest[: end + 1])
            groups.append([""])
        else:
            texts.append(rest[:start])
            groups.append(_expand_range_body(body, item, where))
        rest = rest[end + 1 :]
    total = math.prod(len(group) for group in groups)
    if total > MAX_HOSTS:  # checked before the product is built
        raise InventoryError(f"{item!r} expands to {total:,} hosts (more than {MAX_HOSTS:,})",
                             "check the ranges", where)
    # Slurm's order: the last group varies fastest, then the first, the second, ... the one
    # before the last slowest (`scontrol show hostnames a[1-2]b[1-2]c[1-2]`: a1b1c1 a1b1c2
    # a2b1c1 a2b1c2 a1b2c1 ...). With one or two groups this is the plain left-major order.
    if len(groups) <= 2:  # the plain left-major order, and the common case: no reordering
        return ["".join(parts) for parts in itertools.product(*(_prefixed(texts[i], g) for i, g in enumerate(groups)),
                                                               [rest])]
    loop_order = [*range(len(groups) - 2, -1, -1), len(groups) - 1]
    position = [loop_order.index(i) for i in range(len(groups))]  # group i's place in a combination
    prefixed = [_prefixed(texts[i], groups[i]) for i in loop_order]
    return ["".join([combo[p] for p in position]) + rest for combo in itertools.product(*prefixed)]


def _prefixed(text: str, values: list[str]) -> list[str]:
    return [text + value for value in values] if text else values


def _expand_range_body(body: str, item: str, where: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if re.fullmatch(r"[0-9]+", part):
            values.append(part)
            continue
        match = re.fullmatch(r"([0-9]+)-([0-9]+)", part)
        if match is None:
            raise InventoryError(f"bad range {part!r} in {item!r}", "ranges look like 01-04 or 1,3,5", where)
        low_text, high_text = match.groups()
        low, high = int(low_text), int(high_text)
        if high < low:
            raise InventoryError(f"range {part!r} in {item!r} runs backwards", f"write {high_text}-{low_text}", where)
        if high - low + 1 + len(values) > MAX_HOSTS:
            raise InventoryError(f"range {part!r} in {item!r} names more than {MAX_HOSTS:,} hosts",
                                 "check the range", where)
        width = len(low_text) if low_text.startswith("0") else 0
        values.extend(str(number).zfill(width) for number in range(low, high + 1))
    return values


def parse_host_list(expr: str, where: str = "--hosts") -> list[Host]:
    """Hosts from ``--hosts`` (or ``SLURM_JOB_NODELIST``): a Slurm list of ``[user@]host[:port]``."""
    hosts = [parse_host_token(token, where) for token in expand_hostlist(expr, where)]
    check_unique(hosts)
    return hosts


def hosts_from_environment(environ: Mapping[str, str]) -> list[Host] | None:
    """Hosts of the current Slurm allocation, if ``SLURM_JOB_NODELIST`` is set."""
    nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        return None
    return parse_host_list(nodelist, "SLURM_JOB_NODELIST")


def with_default_slots(hosts: list[Host], slots_per_host: int | None) -> list[Host]:
    """Fill unknown slots from ``--gpus-per-node`` (hostfile values win)."""
    if slots_per_host is None:
        return hosts
    if not 1 <= slots_per_host <= MAX_SLOTS:
        raise InventoryError(f"--gpus-per-node must be 1-{MAX_SLOTS}, got {slots_per_host}",
                             "give the number of GPUs per node", "--gpus-per-node")
    # Host(...) rather than dataclasses.replace: a tenth of its cost, for 100,000 hosts
    return [h if h.slots is not None else Host(h.name, h.user, h.port, slots_per_host, h.slot_ids, h.where, h.spare)
            for h in hosts]


def split_spares(hosts: Sequence[Host], where: str = "hostfile") -> tuple[list[Host], list[Host]]:
    """(the first world, the spares): a hostfile's hosts marked ``spare=true`` are held back. A
    hostfile of spares only has no world to start: refused."""
    world = [h for h in hosts if not h.spare]
    spares = [h for h in hosts if h.spare]
    if spares and not world:
        raise InventoryError(f"every host ({len(spares)}) is marked spare=true: no host is left to start the run",
                             "remove spare=true from the hosts the run starts on", where)
    return world, spares


def pick_replacements(excluded: Sequence[Host], spares: Sequence[Host],
                      taken: Iterable[str] = ()) -> tuple[dict[str, Host], list[Host]]:
    """Spares for the ``excluded`` hosts, in hostfile order: for each excluded host the first
    spare not ``taken`` (names already used: in the world, or excluded before) that runs as
    many processes, else the first free one. Returns (excluded name -> its replacement, the
    excluded hosts no spare is left for)."""
    used = set(taken)
    free = [s for s in spares if s.name not in used]
    chosen: dict[str, Host] = {}
    missing: list[Host] = []
    for host in excluded:
        same = [s for s in free if s.num_selected_slots == host.num_selected_slots]
        if not (same or free):
            missing.append(host)
            continue
        pick = (same or free)[0]
        free.remove(pick)
        chosen[host.name] = pick
    return chosen, missing


def parse_filter(expr: str, where: str) -> dict[str, tuple[int, ...] | None]:
    """Parse ``host1:0,1@host2`` into ``{host: slot ids or None for all}``.

    A host named twice gets the union of its slots (``h:1@h:0,1`` is ``h:0,1``); a bare name
    among them means all of its slots.
    """
    selection: dict[str, tuple[int, ...] | None] = {}
    if not expr.strip():
        raise InventoryError("empty filter", "write host1:0,1@host2", where)
    for part in expr.split("@"):
        part = part.strip()
        if not part:
            raise InventoryError(f"empty entry in {expr!r}", "separate hosts with a single '@'", where)
        name, sep, slot_text = part.partition(":")
        ids: tuple[int, ...] | None = None
        if sep:
            try:
                texts = [t.strip() for t in slot_text.split(",")]
                if not all(is_decimal(t.removeprefix("-")) and len(t) < 7 for t in texts):
                    raise ValueError(slot_text)
                ids = tuple(sorted({int(s) for s in slot_text.split(",")}))
            except ValueError:
                raise InventoryError(
                    f"slot ids must be integers in {part!r}", "write host:0,1,2", where
                ) from None
            if any(i < 0 for i in ids):
                raise InventoryError(f"negative slot id in {part!r}", "slot ids start at 0", where)
        if name in selection:  # named again: the slots add up, as DeepSpeed merges them
            before = selection[name]
            ids = None if before is None or ids is None else tuple(sorted({*before, *ids}))
        selection[name] = ids
    return selection


def select_hosts(hosts: list[Host], include: str | None = None, exclude: str | None = None) -> list[Host]:
    """Apply DeepSpeed-style ``--include``/``--exclude`` and return the hosts that keep a slot.

    A bare host name means all of its slots (DeepSpeed itself selects nothing there). Naming an
    unknown host or slot, or ending with nothing selected, is an error.
    """
    if include and exclude:
        raise InventoryError("--include and --exclude cannot be combined", "use one of them", "--include/--exclude")
    if not include and not exclude:
        return hosts
    flag = "--include" if include else "--exclude"
    selection = parse_filter(include or exclude or "", flag)
    by_name = {h.name: h for h in hosts}
    for name, ids in selection.items():
        host = by_name.get(name)
        if host is None:
            known = ", ".join(sorted(by_name)[:8])
            raise InventoryError(f"unknown host {name!r}", f"hosts are: {known}", flag)
        if ids is not None:
            if host.slots is None:
                raise InventoryError(
                    f"slots of {name!r} are unknown, so slot ids cannot be checked",
                    "give slots=N in the hostfile or --gpus-per-node",
                    flag,
                )
            bad = [i for i in ids if i >= host.slots]
            if bad:
                raise InventoryError(
                    f"{name!r} has slots 0-{host.slots - 1}, not {','.join(map(str, bad))}",
                    "use slot ids below the host's slots",
                    flag,
                )
    selected = [_filtered(h, selection.get(h.name, ()), name_given=h.name in selection, keep=bool(include))
                for h in hosts]
    result = [h for h in selected if h is not None]
    if not result:
        raise InventoryError("the filter selects no slot on any host", "check the host names and slot ids", flag)
    return result


def _filtered(host: Host, ids: tuple[int, ...] | None, name_given: bool, keep: bool) -> Host | None:
    if keep:
        if not name_given:
            return None
        return host if ids is None else replace(host, slot_ids=ids)
    if not name_given:
        return host
    if ids is None:
        return None
    assert host.slots is not None  # select_hosts checked that slots are known when ids are named
    excluded = set(ids)
    remaining = tuple(i for i in range(host.slots) if i not in excluded)
    return replace(host, slot_ids=remaining) if remaining else None


def compress_hostlist(names: Iterable[str]) -> str:
    """The inverse of :func:`expand_hostlist` for display: node1,node2,node3,gpu-a -> node[1-3],gpu-a.

    Names are grouped by their text before a trailing number; runs of consecutive numbers of the
    same width become ranges. Order of first appearance is kept.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match is None:
            plain.append(name)
            order.append(name)
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        numbers = sorted(set(groups[item]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{str(numbers[0]).zfill(width)}")
            continue
        ranges: list[str] = []
        low = high = numbers[0]
        for number in [*numbers[1:], None]:
            if number is not None and number == high + 1:
                high = number
                continue
            ranges.append(str(low).zfill(width) if low == high else f"{str(low).zfill(width)}-{str(high).zfill(width)}")
            if number is not None:
                low = high = number
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)
