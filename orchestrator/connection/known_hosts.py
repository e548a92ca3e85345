"""known_hosts files read as OpenSSH reads them, and the verdict on a server's host key.

Paramiko's ``HostKeys`` understands plain and hashed names, but skips ``@cert-authority`` and
``@revoked`` lines without a word, matches no wildcard (``*.example.com``, ``10.0.0.?``) or
negated (``!bad.example.com``) pattern, and compares only the first key of a type. orch therefore
keeps Paramiko's own key stores empty and decides every key here, with OpenSSH's rules
(sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT", OpenSSH 9.x ``hostfile.c``/``match.c``):

* a line is ``[marker] patterns keytype base64 [comment]``; ``patterns`` is a comma list of host
  patterns (``*`` and ``?`` wildcards, ``!`` negation: a negated match excludes the line), or one
  hashed name ``|1|salt|hmac-sha1``; a host on a port other than 22 is looked up as
  ``[host]:port`` (the pattern is compared to that whole string, brackets included);
* ``@revoked``: that key is never accepted for the matched hosts, whatever else lists it;
* ``@cert-authority``: the key is a CA that signs host certificates. Paramiko cannot verify host
  certificates, so a host vouched for only by a CA is refused, with a message saying so (adding
  its plain key blindly would bypass the CA);
* a plain line with the server's key type and key: trusted; with the same type and another key:
  the key CHANGED; with other key types only: refused (OpenSSH refuses too; see
  :func:`known_key_types` for how orch asks the server for a type it knows first).

Host names are compared in lower case, as OpenSSH does. Lines that do not parse (too few fields,
bad base64, unknown markers) are skipped, as OpenSSH skips them. Pure functions except
:func:`read_known_hosts`.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from paramiko.hostkeys import HostKeys
from paramiko.util import constant_time_bytes_eq

TRUSTED, UNKNOWN, CHANGED, REVOKED, CERT_ONLY, OTHER_TYPES = (
    "trusted", "unknown", "changed", "revoked", "cert_only", "other_types")

_MARKERS = {"@cert-authority": "cert-authority", "@revoked": "revoked"}


@dataclass(frozen=True)
class KnownHostLine:
    """One key line of a known_hosts file: where it is (``path``, 1-based ``lineno``), its
    ``marker`` (None, ``cert-authority`` or ``revoked``), host ``patterns``, ``key_type``
    (``ssh-ed25519``...) and ``key_b64`` (the base64 key blob)."""

    path: str
    lineno: int
    marker: str | None
    patterns: tuple[str, ...]
    key_type: str
    key_b64: str

    @property
    def where(self) -> str:
        """``path:line``, for messages."""
        return f"{self.path}:{self.lineno}"


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`check_host_key`: ``status`` (TRUSTED, UNKNOWN, CHANGED, REVOKED,
    CERT_ONLY, OTHER_TYPES) and the ``lines`` that decided it (the matching key for TRUSTED,
    the revoking line, the known keys of the same or of other types, the CA lines)."""

    status: str
    lines: tuple[KnownHostLine, ...] = ()


def host_key_name(host: str, port: int) -> str:
    """The name a host is listed under: ``host`` on port 22, else ``[host]:port`` (OpenSSH
    ``put_host_port``; Paramiko's ``SSHClient.connect`` uses the same form)."""
    return host if int(port) == 22 else f"[{host}]:{int(port)}"


def parse_known_hosts(text: str, path: str) -> list[KnownHostLine]:
    """Key lines of known_hosts ``text`` (read from ``path``, kept for messages), in file order.

    Blank lines, ``#`` comments and lines that do not parse are skipped (OpenSSH skips them too).
    """
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker = _MARKERS.get(fields[0].lower())
            if marker is None:
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        patterns, key_type, key_b64 = fields[0], fields[1], fields[2]
        try:
            base64.b64decode(key_b64, validate=True)
        except (binascii.Error, ValueError):
            continue
        out.append(KnownHostLine(path, lineno, marker, tuple(p for p in patterns.split(",") if p),
                                 key_type, key_b64))
    return out


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH ``match_pattern``: ``*`` any run, ``?`` one character, nothing else special
    (``[`` and ``]`` are literal, so ``[host]:2222`` patterns work)."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.S) is not None


def _hashed_match(entry: str, name: str) -> bool:
    """Whether hashed entry ``|1|salt|hmac`` is ``name`` (Paramiko's ``HostKeys.hash_host``)."""
    try:
        expect = HostKeys.hash_host(name, entry)
    except (binascii.Error, ValueError, IndexError, TypeError, AssertionError):  # a malformed salt
        return False
    return constant_time_bytes_eq(expect.encode(), entry.encode())


def host_matches(patterns: Sequence[str], name: str) -> bool:
    """Whether host ``name`` (``host`` or ``[host]:port``) is listed by ``patterns``.

    OpenSSH ``match_hostname``: case-insensitive; any negated pattern (``!p``) that matches
    excludes the name, else any positive one that matches includes it; ``|1|...`` entries are
    compared by their HMAC.
    """
    name = name.lower()
    hit = False
    for pat in patterns:
        if pat.startswith("|1|"):
            hit = hit or _hashed_match(pat, name)
        elif pat.startswith("!"):
            if _glob(pat[1:].lower(), name):
                return False
        elif _glob(pat.lower(), name):
            hit = True
    return hit


def check_host_key(lines: Iterable[KnownHostLine], name: str, key_type: str, key_b64: str) -> Verdict:
    """Decide on the key a server presented (``key_type``, ``key_b64``) for ``name``
    (:func:`host_key_name`), from the ``lines`` of every known_hosts file searched.

    In OpenSSH's order: a ``@revoked`` line with this key -> REVOKED; a plain line with this
    key -> TRUSTED; plain lines with this key type but another key -> CHANGED; otherwise
    ``@cert-authority`` lines -> CERT_ONLY (orch cannot check certificates); plain lines of other
    types only -> OTHER_TYPES; nothing -> UNKNOWN.
    """
    matching = [ln for ln in lines if host_matches(ln.patterns, name)]
    revoked = [ln for ln in matching if ln.marker == "revoked" and ln.key_b64 == key_b64]
    if revoked:
        return Verdict(REVOKED, tuple(revoked))
    plain = [ln for ln in matching if ln.marker is None]
    same = [ln for ln in plain if ln.key_type == key_type and ln.key_b64 == key_b64]
    if same:
        return Verdict(TRUSTED, (same[0],))
    same_type = [ln for ln in plain if ln.key_type == key_type]
    if same_type:
        return Verdict(CHANGED, tuple(same_type))
    ca = [ln for ln in matching if ln.marker == "cert-authority"]
    if ca:
        return Verdict(CERT_ONLY, tuple(ca))
    if plain:
        return Verdict(OTHER_TYPES, tuple(plain))
    return Verdict(UNKNOWN)


def known_key_types(lines: Iterable[KnownHostLine], name: str) -> list[str]:
    """Key types of the plain (not revoked, not CA) keys listed for ``name``, first seen first.

    OpenSSH asks the server for a host key type it already knows (``order_hostkeyalgs``);
    orch passes these to Paramiko so the server shows that key, not another of its keys.
    """
    types: list[str] = []
    for ln in lines:
        if ln.marker is None and ln.key_type not in types and host_matches(ln.patterns, name):
            types.append(ln.key_type)
    return types


def read_known_hosts(paths: Sequence[str]) -> tuple[list[KnownHostLine], list[str]]:
    """The key lines of every file in ``paths`` that exists (in order), and the paths that do not
    exist or cannot be read (for messages). A file that cannot be decoded is read with
    replacement characters (its bad lines then fail to parse and are skipped)."""
    lines: list[KnownHostLine] = []
    absent: list[str] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            absent.append(path)
            continue
        lines += parse_known_hosts(text, path)
    return lines, absent


def describe_files(paths: Sequence[str], absent: Sequence[str]) -> str:
    """``a, b (absent), c`` — every file searched, for a refusal message."""
    return ", ".join(f"{p} (absent)" if p in absent else p for p in paths)


def format_line(name: str, key_type: str, key_b64: str) -> str:
    """The known_hosts line orch appends for an accepted new key (plain name, as ssh-keyscan)."""
    return f"{name} {key_type} {key_b64}\n"


def expand_paths(paths: Iterable[str]) -> list[str]:
    """``~`` expanded, duplicates dropped, order kept."""
    return list(dict.fromkeys(os.path.expanduser(p) for p in paths))
