"""Does this look like a credential? The one answer, for a job's environment (rendering refuses
a literal credential, the dry run masks it) and for the report pages (:func:`trainops.reports.html.redact`).

Pure, no I/O, importing nothing of trainops, so any layer can use it. Three kinds of evidence:

- the **name** says it holds a credential: ``PASSWORD``, ``DB_PASS``, ``PGPASSWORD``,
  ``HF_TOKEN``, ``GITHUB_PAT``, ``OPENAI_API_KEY``, ``AWS_ACCESS_KEY_ID``,
  ``AZURE_STORAGE_CONNECTION_STRING``, ``AWS_SECRET_ACCESS_KEY_2`` ... (its words, with any
  prefix and suffix; :func:`credential_name`);
- the **value** is one whatever the name: a URL whose userinfo has a password
  (``https://user:pw@host``), a connection string with ``Password=`` or ``AccountKey=``, a
  private key, or a token in a well-known format (``AKIA...``, ``ghp_...``, ``hf_...``, ``sk-...``);
- a **random-looking token** under a name that hints at one (``SIGNING_KEY``, ``BASIC_AUTH``,
  ``SENTRY_DSN``).

A name that says where a credential is rather than what it is (``HF_TOKEN_PATH=/etc/hf``,
``AWS_SHARED_CREDENTIALS_FILE=/var/run/aws``, ``OAUTH_TOKEN_URL=https://...``) is no credential
when its value is such a location; nor is an empty value or an on/off switch
(``HF_HUB_DISABLE_IMPLICIT_TOKEN=1``): neither has anything to leak. Reasons never quote the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MASK",
    "credential_name",
    "credential_reason",
    "credential_under_name",
    "literal_credentials",
    "mask_env",
    "mask_text",
    "without_userinfo",
]

MASK = "***"

# A word of a name that is a credential on its own (after splitting the name into words).
_CREDENTIAL_WORDS = frozenset(
    {"PASS", "PAT", "PWD", "CRED", "CREDS", "APIKEY", "SECRETKEY", "ACCESSKEY", "PRIVATEKEY", "AUTHORIZATION"}
)
# Parts that make any word a credential's (PGPASSWORD, CLIENTSECRET, GOOGLE_CREDENTIALS).
_CREDENTIAL_PARTS = ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "CREDENTIAL")
# Two words that name a credential together: API_KEY, AWS_ACCESS_KEY_ID, CONNECTION_STRING.
_KEY_KINDS = frozenset(
    {"API", "ACCESS", "PRIVATE", "ACCOUNT", "SECRET", "MASTER", "SIGNING", "ENCRYPTION", "CLIENT", "AUTH"}
)
_PAIRS = frozenset({("CONNECTION", "STRING"), ("CONN", "STRING"), ("CONN", "STR")})
# Words that hint at a credential: one when the value looks like a random token.
_HINT_WORDS = frozenset(
    {"KEY", "KEYS", "AUTH", "SALT", "SIGNATURE", "SIG", "HMAC", "COOKIE", "SESSION", "DSN"}
)
# A word after the credential's that says the variable holds where it is, not what it is.
_LOCATION_WORDS = frozenset({"FILE", "PATH", "DIR", "URL", "URI", "ENDPOINT", "HOST"})
_LOCATION_NAMES = frozenset({"GOOGLE_APPLICATION_CREDENTIALS"})  # the path of a key file
_SWITCHES = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off"})

_NAME_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# scheme://userinfo@ (the userinfo stops at the first / ? # so a query's "a@b" is never one)
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@]+)@")
_SECRET_FORMATS = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic, Stripe
    r"|\bhf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+"  # a JWT
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|(?i:\b(?:password|pwd|accountkey|sharedaccesskey|sharedaccesssignature|sig)=[^;&\s]+)"
)
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9+/=_.~-]+$")


def _words(name: str) -> list[str]:
    """``name``'s words, upper case, without the numbers: ``AWS_SECRET_ACCESS_KEY_2`` ->
    AWS SECRET ACCESS KEY; ``secretKeyRef`` -> SECRET KEY REF."""
    return [w.upper() for w in _NAME_PART.findall(name) if not w.isdigit()]


def _credential_word(word: str, alone: bool) -> bool:
    if word == "PWD" and alone:  # the shell's working directory
        return False
    return (
        word in _CREDENTIAL_WORDS or word.endswith("TOKEN") or any(part in word for part in _CREDENTIAL_PARTS)
    )


def _credential_at(words: list[str]) -> int | None:
    """The index of the last word that makes ``words`` a credential's name, or None."""
    found = None
    for i, word in enumerate(words):
        pair = (words[i - 1], word) if i else None
        if (
            _credential_word(word, alone=len(words) == 1)
            or (word == "KEY" and pair is not None and pair[0] in _KEY_KINDS)
            or pair in _PAIRS
        ):
            found = i
    return found


def _is_location(value: str) -> bool:
    return value.startswith(("/", "~", "./")) or "://" in value


def credential_name(name: str) -> bool:
    """True when the name ``name`` alone says it holds a credential (``DB_PASS``, ``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY_2``, ``accessKey``), whatever words come before or after."""
    return _credential_at(_words(name)) is not None


def _token_like(value: str) -> bool:
    """A random-looking token: 16+ characters of a token alphabet, letters and digits, and at
    least 3 bits of entropy a character (a digest, a key; not a word, a path or a host name)."""
    if len(value) < 16 or value.startswith("/") or not _TOKEN_CHARS.match(value):
        return False
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    counts = {c: value.count(c) for c in set(value)}
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.0


def _url_secret(value: str) -> bool:
    """A URL in ``value`` carries a credential in its userinfo: a password, or a token as the user."""
    for match in _URL_USERINFO.finditer(value):
        user, colon, password = match["userinfo"].partition(":")
        if (colon and password) or _token_like(user):
            return True
    return False


def credential_reason(name: str, value: str) -> str | None:
    """Why the variable ``name`` set to ``value`` looks like a credential, or None when it does
    not. The reason names what gave it away, never the value.

    :param name: a variable name or a record's key (``DB_PASSWORD``, ``aws_session_token``).
    :param value: its literal value.
    """
    if _nothing_to_leak(value):
        return None
    if _url_secret(value):
        return (
            "by its value: a URL with a password or token in its userinfo; keep scheme://host:port/path only"
        )
    if _SECRET_FORMATS.search(value):
        return "by its value: a secret in a well-known format"
    return _name_reason(name, value)


def credential_under_name(name: str, value: str) -> bool:
    """True when ``value`` is a credential because of the name it is under (:func:`credential_reason`
    by the name, or a random token under a hinting one): the whole value is secret, where a
    secret inside a value (a URL's password) can be masked alone (:func:`mask_text`)."""
    return not _nothing_to_leak(value) and _name_reason(name, value) is not None


def _nothing_to_leak(value: str) -> bool:
    return value.strip() == "" or value.strip().lower() in _SWITCHES


def _name_reason(name: str, value: str) -> str | None:
    words = _words(name)
    at = _credential_at(words)
    located = name.upper() in _LOCATION_NAMES or (
        at is not None and any(w in _LOCATION_WORDS for w in words[at + 1 :])
    )
    if located and _is_location(value):
        return None  # where the credential is (a mounted file, a token endpoint)
    if at is not None or name.upper() in _LOCATION_NAMES:
        return "by its name"
    if any(w in _HINT_WORDS for w in words) and _token_like(value):
        return "by its value: a random-looking token under a name that hints at a key"
    return None


def literal_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that look like credentials, each with its reason (:func:`credential_reason`)."""
    found = {}
    for name, value in env.items():
        reason = credential_reason(name, value)
        if reason:
            found[name] = reason
    return found


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the value of every credential-like variable replaced by :data:`MASK`."""
    secret = literal_credentials(env)
    return {name: MASK if name in secret else value for name, value in env.items()}


def mask_text(text: str) -> str:
    """``text`` with URL passwords (``scheme://user:***@``) and well-known secret formats masked."""

    def userinfo(match: re.Match[str]) -> str:
        user, colon, password = match["userinfo"].partition(":")
        if colon and password:
            return f"{match['head']}{user}:{MASK}@"
        return f"{match['head']}{MASK}@" if _token_like(user) else match[0]

    return _SECRET_FORMATS.sub(MASK, _URL_USERINFO.sub(userinfo, text))


def without_userinfo(url: str) -> tuple[str, bool]:
    """``url`` without its userinfo (``user:password@``): scheme, host, port, path, query kept;
    and whether there was one to drop."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, False
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), True
