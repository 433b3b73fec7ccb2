"""OpenSSH ``known_hosts`` files, read as OpenSSH reads them (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT").

Pure: text in, values out. Each line is ``[@marker] patterns keytype base64-key [comment]``:

- ``patterns``: comma-separated names or addresses (``[host]:port`` off port 22), with ``*``
  and ``?`` wildcards and ``!`` negation, or one hashed name ``|1|salt|hmac-sha1`` (HashKnownHosts);
- ``@cert-authority``: the key is a CA; hosts matching the patterns are trusted when they show
  a host certificate it signed;
- ``@revoked``: the key must never be accepted.

A line that cannot be read (an unknown marker, too few fields, corrupt base64) is skipped and
reported as a problem naming ``file:line``, as OpenSSH skips it; it never stops the others.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MARKERS = ("@cert-authority", "@revoked")


@dataclass(frozen=True)
class KnownHost:
    """One usable line of a known_hosts file."""

    patterns: str  # as written: "node1,10.0.0.1", "[h]:2222", "|1|salt|hash", "*.example.org"
    key_type: str  # as written on the line: "ssh-ed25519", ...
    key_blob: bytes  # the decoded public key (SSH wire format)
    marker: str = ""  # "", "@cert-authority" or "@revoked"
    where: str = ""  # file:line

    @property
    def blob_type(self) -> str:
        """The key type named inside the blob (what a server's key is compared by)."""
        return key_blob_type(self.key_blob)

    def matches(self, name: str) -> bool:
        return host_matches(self.patterns, name)


def parse_known_hosts(text: str, path: str) -> tuple[list[KnownHost], list[str]]:
    """The usable lines of a known_hosts file, and ``file:line: why`` for each skipped one."""
    entries: list[KnownHost] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            marker = fields.pop(0)
            if marker not in MARKERS:
                problems.append(f"{where}: unknown marker {marker[:32]!r}")
                continue
        if len(fields) < 3:
            problems.append(f"{where}: expected 'hosts keytype key', got {len(fields)} field(s)")
            continue
        patterns, key_type, encoded = fields[:3]
        try:
            blob = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            problems.append(f"{where}: the key is not valid base64")
            continue
        if not key_blob_type(blob):
            problems.append(f"{where}: the key is not an SSH public key")
            continue
        entries.append(KnownHost(patterns, key_type, blob, marker, where))
    return entries, problems


def host_matches(patterns: str, name: str) -> bool:
    """Whether ``name`` (``host`` or ``[host]:port``) matches a line's host field."""
    if patterns.startswith("|1|"):
        return _hashed_matches(patterns, name)
    matched = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if _wildcard_match(pattern.lstrip("!"), name):
            if negated:
                return False  # a negated match wins over every positive one
            matched = True
    return matched


def _wildcard_match(pattern: str, name: str) -> bool:
    """OpenSSH patterns: ``*`` and ``?`` only (``[`` is literal, as in ``[host]:2222``)."""
    regex = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name.lower()) is not None


def _hashed_matches(field: str, name: str) -> bool:
    parts = field.split("|")
    if len(parts) != 4:
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
        expected = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return False
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(digest, expected)


def key_blob_type(blob: bytes) -> str:
    """The first string of an SSH key blob (its type), or "" when the blob is not one."""
    if len(blob) < 4:
        return ""
    length = int.from_bytes(blob[:4], "big")
    if not 0 < length <= 64 or len(blob) < 4 + length:
        return ""
    try:
        text = blob[4 : 4 + length].decode("ascii")
    except UnicodeDecodeError:
        return ""
    return text if text.isprintable() else ""


def entries_for(entries: Iterable[KnownHost], names: Sequence[str], marker: str = "") -> list[KnownHost]:
    """The lines with ``marker`` that match any of ``names``."""
    return [e for e in entries if e.marker == marker and any(e.matches(n) for n in names)]


def revoked_line(entries: Iterable[KnownHost], names: Sequence[str], blob: bytes) -> KnownHost | None:
    """The ``@revoked`` line that names this key for these hosts, if any."""
    for entry in entries_for(entries, names, "@revoked"):
        if entry.key_blob == blob:
            return entry
    return None
