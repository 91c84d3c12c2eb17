"""Keeping credentials out of every text the SDK shows: error messages and reprs,
span attributes and status descriptions, log lines.

A server can echo anything back: the ``authorization`` header in an error body, a
header value, an SSE line. Every place that turns such text into something shown
goes through one ``Redactor``, built from what the client sends as credentials:
the ``api_key``, the values of credential headers in ``default_headers`` or a
call's own headers (``authorization``, ``api-key``, ``x-api-key``, any name ending
in ``-key``, ``-token`` or ``-secret``; the credential after ``Bearer``/``Basic``,
and the password inside a Basic one) and the userinfo and credential-looking
query parameters of the base URLs.

Each secret is replaced by ``[redacted]`` wherever it appears as given,
lower-cased or upper-cased (``x-load-shed`` is lower-cased when parsed),
percent-encoded, JSON-escaped, or inside base64 (a ``Basic`` header echoed back
encodes the URL's password; the key is found at any of the three byte alignments
base64 can put it at). Other transformations (hashes, reversed or split keys) are
out of reach of any scrubber.

Secrets shorter than ``MIN_SECRET_LENGTH`` (8) characters are not scrubbed: a
one-letter key would turn every message into ``[redacted]``, placeholder keys
such as vLLM's ``EMPTY`` protect nothing, and a key that short is guessed, not
leaked.

Scrubbing always comes before cutting (``quote``): a key straddling the cut
would otherwise leave its first half behind.

Hand-written: no well-kept library scrubs known secrets (in their encoded forms)
from text; the logging "redaction filters" on PyPI match patterns, not the
secrets a client actually holds.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .http import httpx

if TYPE_CHECKING:
    from ..protocol import ServerLoad
    from .exceptions import StormguardError

__all__ = ["MIN_SECRET_LENGTH", "REDACTED", "Redactor", "display_url", "is_credential_name"]

REDACTED = "[redacted]"
#: Shorter secrets are left in place (see the module docstring).
MIN_SECRET_LENGTH = 8

_CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"}
)
_CREDENTIAL_SUFFIXES = ("-key", "_key", "-token", "_token", "-secret", "_secret")
_CREDENTIAL_PARAMS = frozenset(
    {"key", "api-key", "api_key", "apikey", "token", "access_token", "sig", "signature"}
)
# url.full: the semantic conventions (v1.41.0) replace these query values with REDACTED.
_SEMCONV_QUERY_KEYS = frozenset({"awsaccesskeyid", "signature", "sig", "x-goog-signature"})


def _is_credential_name(name: str) -> bool:
    lowered = name.lower()
    return lowered in _CREDENTIAL_HEADERS or lowered.endswith(_CREDENTIAL_SUFFIXES)


#: Whether a header (or query parameter) of this name carries a credential.
is_credential_name = _is_credential_name


def _header_secrets(name: str, value: str) -> list[str]:
    """The credentials in one header value: the part after an auth scheme (and the
    user and password inside ``Basic``), each cookie's value, else the whole value."""
    value = value.strip()
    lowered = name.lower()
    if lowered == "cookie":
        return [part.partition("=")[2].strip() for part in value.split(";")]
    if lowered not in ("authorization", "proxy-authorization"):
        return [value]
    scheme, sep, credential = value.partition(" ")
    if not sep or not scheme.isalpha():
        return [value]
    credential = credential.strip()
    found = [credential]
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credential, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return found
        user, _, password = decoded.partition(":")
        found += [decoded, user, password]
    return found


def _url_secrets(url: str | httpx.URL) -> list[str]:
    """A URL's userinfo (decoded and as written) and its credential-looking query values."""
    try:
        parsed = httpx.URL(str(url))
    except (httpx.InvalidURL, TypeError, ValueError):
        return []
    found = [parsed.username, parsed.password]
    raw_user, _, raw_password = parsed.userinfo.decode("ascii", "replace").partition(":")
    found += [raw_user, raw_password]
    for key, value in parsed.params.multi_items():
        if _is_credential_name(key) or key.lower() in _CREDENTIAL_PARAMS:
            found.append(value)
    return found


def _base64_cores(secret: bytes) -> list[str]:
    """What base64 of any text containing ``secret`` is sure to contain: the encoding
    of its whole 3-byte groups, for each of the three alignments it can start at."""
    cores = []
    for skip in range(3):
        rest = secret[skip:]
        whole = len(rest) // 3 * 3
        core = base64.b64encode(rest[:whole]).decode("ascii")
        if len(core) >= MIN_SECRET_LENGTH:
            cores.append(core)
    return cores


def _forms(secret: str) -> set[str]:
    """Every form of ``secret`` that is scrubbed (see the module docstring)."""
    forms = {secret, secret.lower(), secret.upper()}
    forms.add(urllib.parse.quote(secret, safe=""))
    forms.add(json.dumps(secret)[1:-1])
    forms.update(_base64_cores(secret.encode("utf-8")))
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


@functools.lru_cache(maxsize=256)
def _redactor_for(secrets: frozenset[str]) -> Redactor:
    """One shared, immutable redactor per set of secrets: a call whose headers carry
    the same key as the last one (openai-python's, in transport mode) builds nothing."""
    return Redactor(secrets)


class Redactor:
    """Replaces known secrets in text with ``[redacted]``. Immutable and thread-safe.

    >>> r = Redactor(["sk-proj-0123456789"])
    >>> r.scrub("bad key sk-proj-0123456789")
    'bad key [redacted]'
    >>> r.quote("x" * 8 + "sk-proj-0123456789", limit=12)
    'xxxxxxxx[red'
    """

    __slots__ = ("_forms", "_margin", "_pattern", "_shortest", "secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        #: The credentials themselves (never shown: ``repr`` gives only their count).
        self.secrets = frozenset(s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH)
        forms: set[str] = set()
        for secret in self.secrets:
            forms |= _forms(secret)
        # Longest first: a form that contains another is replaced whole.
        self._forms = tuple(sorted(forms, key=lambda form: (-len(form), form)))
        self._pattern = re.compile("|".join(map(re.escape, self._forms))) if forms else None
        #: A secret that starts before a cut ends within this many characters after it.
        self._margin = len(self._forms[0]) if self._forms else 0
        #: Texts shorter than this hold no secret (most request ids, load-shed reasons).
        self._shortest = len(self._forms[-1]) if self._forms else 0

    @classmethod
    def for_client(
        cls,
        *,
        headers: Mapping[str, str] | None = None,
        urls: Iterable[str | httpx.URL] = (),
        more_headers: Iterable[Mapping[str, str]] = (),
    ) -> Redactor:
        """The redactor of a client: the credentials among its headers and base URLs,
        and among ``more_headers`` (what each of its deployments sends: a key one
        provider echoes about another's is scrubbed as the client's own is)."""
        found = list(_credentials(headers or {}, urls))
        for extra in more_headers:
            found.extend(_credentials(extra, ()))
        return _redactor_for(frozenset(s for s in found if len(s) >= MIN_SECRET_LENGTH))

    def including(
        self, *, headers: Mapping[str, str] | None = None, url: str | httpx.URL | None = None
    ) -> Redactor:
        """This redactor, plus the credentials of one call's own headers and URL (in
        transport mode openai-python sends its own ``authorization``)."""
        if not headers and url is None:
            return self
        found = set(_credentials(headers or {}, () if url is None else (url,)))
        found = {s for s in found if len(s) >= MIN_SECRET_LENGTH} - self.secrets
        if not found:
            return self
        return _redactor_for(self.secrets | found)

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced by ``[redacted]``."""
        pattern = self._pattern
        if pattern is None or len(text) < self._shortest:
            return text
        if not any(form in text for form in self._forms):
            return text  # the common case: a few substring searches, no regex
        return pattern.sub(REDACTED, text)

    def quote(self, text: str, limit: int) -> str:
        """At most ``limit`` characters of ``text``, scrubbed before the cut."""
        return self.scrub(text[: limit + self._margin])[:limit]

    def quote_bytes(self, data: bytes, limit: int) -> str:
        """``quote`` of the start of a body (UTF-8, undecodable bytes replaced)."""
        # A character is at most 4 bytes: this slice holds the first limit + margin.
        return self.quote(data[: 4 * (limit + self._margin)].decode("utf-8", "replace"), limit)

    def scrub_json(self, value: Any) -> Any:
        """A decoded JSON value with every secret in its strings (keys included)
        replaced; ``value`` itself when it holds none."""
        if self._pattern is None or value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str):
            return self.scrub(value)
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            return REDACTED  # not JSON after all, or nested too deep to check: not shown
        scrubbed = self.scrub(text)
        if scrubbed is text:
            return value
        try:
            return json.loads(scrubbed)
        except (ValueError, RecursionError):
            return REDACTED  # a secret that spanned JSON syntax: the whole value goes

    def scrub_load(self, load: ServerLoad) -> ServerLoad:
        """The parsed load headers, with an echoed secret out of ``load_shed`` (the
        only free text among them)."""
        shed = load.load_shed
        if shed is None or self._pattern is None:
            return load
        scrubbed = self.scrub(shed)
        return load if scrubbed is shed else dataclasses.replace(load, load_shed=scrubbed)

    def scrub_error(self, error: StormguardError) -> StormguardError:
        """Scrub, in place, every string an error carries (its message and args, the
        request id, ``code``, ``param``, ``type``, the ``body``, text or JSON) and
        the load it quotes; returns the error.

        The net under the quoting functions: an error built from a library's text
        (an httpx exception quoting a malformed header line) passes through it too.
        ``raw_body``, ``request`` and ``response`` stay what was sent and what came
        back."""
        if self._pattern is None:
            return error
        for name, value in list(vars(error).items()):
            if isinstance(value, str):
                scrubbed = self.scrub(value)
                if scrubbed is not value:
                    setattr(error, name, scrubbed)
            elif name == "body" and isinstance(value, (dict, list)):
                setattr(error, name, self.scrub_json(value))
        error.args = tuple(self.scrub(a) if isinstance(a, str) else a for a in error.args)
        error.server_load = self.scrub_load(error.server_load)
        return error

    def __bool__(self) -> bool:
        """False when there is nothing to scrub."""
        return self._pattern is not None

    def __repr__(self) -> str:
        return f"Redactor({len(self.secrets)} secrets)"


def _credentials(headers: Mapping[str, str], urls: Iterable[str | httpx.URL]) -> Iterable[str]:
    for name, value in headers.items():
        if isinstance(value, str) and _is_credential_name(name):
            yield from _header_secrets(name, value)
    for url in urls:
        yield from _url_secrets(url)


def _hidden_param(key: str) -> bool:
    lowered = key.lower()
    return (
        lowered in _SEMCONV_QUERY_KEYS
        or lowered in _CREDENTIAL_PARAMS
        or (_is_credential_name(lowered))
    )


def display_url(url: str | httpx.URL) -> str:
    """A URL fit to show (``url.full``, error messages, reprs): userinfo replaced by
    ``REDACTED:REDACTED`` and signature query values by ``REDACTED``, as the
    semantic conventions (v1.41.0) ask, and credential-looking ones (``api-key``,
    ``token``...) too. It needs no secret to know of, so it may be cut afterwards."""
    try:
        parsed = httpx.URL(str(url))
    except (httpx.InvalidURL, TypeError, ValueError):
        return "<invalid URL>"
    if parsed.userinfo:
        parsed = parsed.copy_with(username="REDACTED", password="REDACTED")
    if parsed.query and any(_hidden_param(key) for key in parsed.params):
        params = [
            (key, "REDACTED" if _hidden_param(key) else value)
            for key, value in parsed.params.multi_items()
        ]
        parsed = parsed.copy_with(params=params)
    return str(parsed)
