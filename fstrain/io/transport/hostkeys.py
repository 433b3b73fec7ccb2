"""Host-key checks against known_hosts, as OpenSSH makes them, over paramiko's key objects.

paramiko's own ``HostKeys`` stops at the first ``@cert-authority`` or ``@revoked`` line, or
at corrupt base64, with ``InvalidHostKey``: one unusual line would stop every connection. This
module reads the files with :mod:`fstrain.core.hosts.knownhosts` instead, skips (and reports once)
what it cannot read, refuses ``@revoked`` keys, and accepts an OpenSSH host certificate signed
by a ``@cert-authority`` key that matches the host (signature, host type, principals, validity
window checked here; paramiko only proves the server holds the certified key).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fstrain.core.hosts.knownhosts import KnownHost, parse_known_hosts

if TYPE_CHECKING:
    import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
MAX_KNOWN_HOSTS_BYTES = 256 * 1024 * 1024  # read at most this much of one file (a site-wide list is big)
SSH_CERT_TYPE_HOST = 2
_warned: set[str] = set()
_parsed: dict[str, tuple[tuple[str, int, int], tuple[list[KnownHost], list[str]]]] = {}
_cache_lock = threading.Lock()
_warned_lock = threading.Lock()


def load_known_hosts(paths: Sequence[str]) -> list[KnownHost]:
    """Every usable line of ``paths`` (missing or unreadable files count as empty). Lines that
    cannot be read are skipped with one warning per file on stderr, the first time only."""
    entries: list[KnownHost] = []
    for path in paths:
        parsed = _parsed_file(path)
        if parsed is None:
            continue  # like a missing file, as OpenSSH treats an unreadable one
        found, problems = parsed
        entries.extend(found)
        if problems:
            _warn_once(path, problems)
    return entries


def _parsed_file(path: str) -> tuple[list[KnownHost], list[str]] | None:
    """One file's lines, parsed once per version of the file (every host of a fan-out reads it)."""
    try:
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        with _cache_lock:
            cached = _parsed.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
        with open(path, "rb") as handle:
            # Undecodable bytes become U+FFFD: their line fails to parse and is skipped alone.
            text = handle.read(MAX_KNOWN_HOSTS_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    result = parse_known_hosts(text, path)
    with _cache_lock:
        _parsed[path] = (key, result)  # the latest version of each file only
    return result


def _warn_once(path: str, problems: list[str]) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    more = f" (and {len(problems) - 1} more line(s) like it)" if len(problems) > 1 else ""
    sys.stderr.write(f"warning: {problems[0]}: line skipped{more} "
                     "(hint: OpenSSH skips it too; fix or remove it)\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class HostCertificate:
    """The parts of an OpenSSH certificate a host check needs."""

    key_type: str  # e.g. ssh-ed25519-cert-v01@openssh.com
    cert_type: int  # 1 user, 2 host
    key_id: str
    principals: tuple[str, ...]
    valid_after: int  # seconds since the epoch
    valid_before: int
    signature_key: bytes  # the CA's public key blob
    signature: bytes
    signed_data: bytes  # everything the signature covers


def parse_certificate(blob: bytes) -> HostCertificate:
    """Read an OpenSSH certificate blob (PROTOCOL.certkeys); raises ValueError when malformed."""
    import paramiko

    message = paramiko.Message(blob)
    key_type = message.get_text()
    if not key_type.endswith(CERT_SUFFIX):
        raise ValueError(f"not a certificate: {key_type}")
    message.get_binary()  # nonce
    base = key_type[: -len(CERT_SUFFIX)]
    if base == "ssh-ed25519":
        message.get_binary()
    elif base.startswith("ecdsa-sha2-"):
        message.get_text()
        message.get_binary()
    elif base == "ssh-rsa":
        message.get_mpint()
        message.get_mpint()
    else:
        raise ValueError(f"unsupported certificate type {key_type}")
    message.get_int64()  # serial
    cert_type = message.get_int()
    key_id = message.get_text()
    principals_message = paramiko.Message(message.get_binary())
    principals: list[str] = []
    while principals_message.get_remainder():
        principals.append(principals_message.get_text())
    valid_after = message.get_int64()
    valid_before = message.get_int64()
    message.get_binary()  # critical options
    message.get_binary()  # extensions
    message.get_binary()  # reserved
    signature_key = message.get_binary()
    signed_length = message.packet.tell()
    signature = message.get_binary()
    if not signature or not signature_key:
        raise ValueError("truncated certificate")
    return HostCertificate(key_type, cert_type, key_id, tuple(principals), valid_after, valid_before,
                           signature_key, signature, blob[:signed_length])


def certificate_problem(cert: HostCertificate, ca: KnownHost, host_names: Sequence[str],
                        now_s: float | None = None) -> str | None:
    """Why ``cert`` does not certify this host under ``ca``, or None when it does."""
    import paramiko

    if cert.signature_key != ca.key_blob:
        return "signed by another CA"
    if cert.cert_type != SSH_CERT_TYPE_HOST:
        return "a user certificate, not a host certificate"
    now = time.time() if now_s is None else now_s
    if not cert.valid_after <= now < cert.valid_before:
        return "outside its validity period"
    if cert.principals and not any(name in cert.principals for name in host_names):
        return f"issued for {', '.join(cert.principals[:4])}, not {host_names[0]}"
    try:
        ca_key = paramiko.PKey.from_type_string(ca.blob_type, ca.key_blob)
        valid = ca_key.verify_ssh_sig(cert.signed_data, paramiko.Message(cert.signature))
    except Exception as exc:  # an unsupported or malformed CA key
        return f"its signature cannot be checked ({exc})"
    return None if valid else "its CA signature is not valid"


def certificate_of(key: paramiko.PKey) -> HostCertificate | None:
    """The certificate a server presented along with its key, if it presented one."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not str(blob.key_type).endswith(CERT_SUFFIX):
        return None
    try:
        return parse_certificate(bytes(blob.key_blob))
    except (ValueError, Exception):
        return None
