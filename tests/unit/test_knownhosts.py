"""known_hosts as OpenSSH reads it: markers, hashed names, wildcards, bad lines; host certificates."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
from pathlib import Path

import pytest

from fstrain.core.hosts.knownhosts import entries_for, host_matches, parse_known_hosts, revoked_line
from fstrain.io.transport.hostkeys import certificate_problem, load_known_hosts, parse_certificate

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
OTHER = "AAAAC3NzaC1lZDI1NTE5AAAAIB3bDq5pZGq4vQx6m6ySoj1S1tQSRdoQeUUpoMEA4uQd"


def test_markers_and_bad_lines_are_read_as_openssh_reads_them() -> None:
    text = (
        f"node1,10.0.0.1 ssh-ed25519 {KEY}\n"
        f"@cert-authority *.cluster ssh-ed25519 {OTHER} ca@corp\n"
        f"@revoked * ssh-ed25519 {OTHER}\n"
        "node2 ssh-ed25519 AAAA!!!notbase64\n"
        "@future node3 ssh-ed25519 AAAA\n"
        "node4 ssh-ed25519\n"
        "# a comment\n\n"
        f"node5 ssh-ed25519 {base64.b64encode(b'garbage').decode()}\n"
    )
    entries, problems = parse_known_hosts(text, "kh")
    assert [(e.marker, e.patterns, e.where) for e in entries] == [
        ("", "node1,10.0.0.1", "kh:1"), ("@cert-authority", "*.cluster", "kh:2"), ("@revoked", "*", "kh:3")]
    assert problems == ["kh:4: the key is not valid base64", "kh:5: unknown marker '@future'",
                        "kh:6: expected 'hosts keytype key', got 2 field(s)", "kh:9: the key is not an SSH public key"]
    assert entries[0].blob_type == "ssh-ed25519"
    assert [e.where for e in entries_for(entries, ["gpu1.cluster"], "@cert-authority")] == ["kh:2"]
    assert entries_for(entries, ["10.0.0.1"]) == [entries[0]]
    assert revoked_line(entries, ["anything"], base64.b64decode(OTHER)) == entries[2]
    assert revoked_line(entries, ["anything"], base64.b64decode(KEY)) is None


def test_host_patterns_hashed_wildcards_negation_ports() -> None:
    salt = b"0123456789abcdef0123"
    digest = hmac.new(salt, b"[node9]:2222", hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    assert host_matches(hashed, "[node9]:2222") and not host_matches(hashed, "node9")
    assert host_matches("node?,!node3", "node1") and not host_matches("node?,!node3", "node3")
    assert host_matches("*.Example.org", "a.example.ORG")
    assert host_matches("[10.0.0.*]:2222", "[10.0.0.7]:2222") and not host_matches("[10.0.0.*]:2222", "10.0.0.7")
    assert not host_matches("|1|bad", "x")


def test_unreadable_lines_warn_once_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"bad ssh-ed25519 %%%\nnode1 ssh-ed25519 {KEY}\nworse ssh-ed25519 ###\n")
    assert [e.patterns for e in load_known_hosts([str(known), str(tmp_path / "missing")])] == ["node1"]
    load_known_hosts([str(known)])
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert f"warning: {known}:1: the key is not valid base64: line skipped (and 1 more line(s) like it)" in err


def _keygen(*args: str) -> None:
    subprocess.run(["ssh-keygen", "-q", *args], check=True, capture_output=True)


@pytest.fixture()
def signed_host(tmp_path: Path) -> tuple[bytes, str, Path]:
    """A CA, a host key and its host certificate for node1 / 10.0.0.1 (made by ssh-keygen)."""
    _keygen("-t", "ed25519", "-N", "", "-f", str(tmp_path / "ca"))
    _keygen("-t", "ed25519", "-N", "", "-f", str(tmp_path / "host"))
    _keygen("-s", str(tmp_path / "ca"), "-I", "node1-key", "-h", "-n", "node1,10.0.0.1", "-V", "-1d:+1d",
            str(tmp_path / "host.pub"))
    cert_blob = base64.b64decode((tmp_path / "host-cert.pub").read_text().split()[1])
    ca_line = "@cert-authority node* " + " ".join((tmp_path / "ca.pub").read_text().split()[:2])
    return cert_blob, ca_line, tmp_path


def test_host_certificate_signed_by_the_ca(signed_host: tuple[bytes, str, Path]) -> None:
    cert_blob, ca_line, folder = signed_host
    cert = parse_certificate(cert_blob)
    assert (cert.cert_type, cert.key_id, cert.principals) == (2, "node1-key", ("node1", "10.0.0.1"))
    (ca,), _ = parse_known_hosts(ca_line, "kh")
    assert certificate_problem(cert, ca, ["10.0.0.1", "node1"]) is None
    assert certificate_problem(cert, ca, ["node2"]) == "issued for node1, 10.0.0.1, not node2"
    assert certificate_problem(cert, ca, ["node1"], now_s=cert.valid_before + 1) == "outside its validity period"
    _keygen("-t", "ed25519", "-N", "", "-f", str(folder / "rogue"))
    (rogue,), _ = parse_known_hosts("@cert-authority * " + (folder / "rogue.pub").read_text(), "kh")
    assert certificate_problem(cert, rogue, ["node1"]) == "signed by another CA"
    forged = parse_certificate(cert_blob.replace(b"node1", b"node2"))  # a principal changed after signing
    assert forged.principals == ("node2", "10.0.0.1")
    assert certificate_problem(forged, ca, ["node2"]) == "its CA signature is not valid"


def test_user_certificate_is_not_a_host_certificate(tmp_path: Path) -> None:
    _keygen("-t", "ed25519", "-N", "", "-f", str(tmp_path / "ca"))
    _keygen("-t", "ed25519", "-N", "", "-f", str(tmp_path / "user"))
    _keygen("-s", str(tmp_path / "ca"), "-I", "someone", "-n", "root", str(tmp_path / "user.pub"))
    cert = parse_certificate(base64.b64decode((tmp_path / "user-cert.pub").read_text().split()[1]))
    (ca,), _ = parse_known_hosts("@cert-authority * " + (tmp_path / "ca.pub").read_text(), "kh")
    assert certificate_problem(cert, ca, ["node1"]) == "a user certificate, not a host certificate"


def test_a_binary_line_is_skipped_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(b"\xff\xfe\x00garbage\n" + f"node1 ssh-ed25519 {KEY}\n".encode())
    assert [e.patterns for e in load_known_hosts([str(known)])] == ["node1"]
    assert f"{known}:1:" in capsys.readouterr().err
