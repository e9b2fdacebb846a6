"""Keep secrets out of what distenv prints: `distenv doctor`, error messages, logs.

A variable is secret by its *name* (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``AZUREML_RUN_TOKEN``, ``DB_PASSWORD``, ``SM_HP_AUTH``, every ``AWS_*``, ...) and then its whole value is
hidden. Any other value is scrubbed of what *looks* like a secret wherever it appears:
credentials in URLs (``https://user:pass@host``), secret query parameters (``?sig=``,
``token=``, ``api_key=``), ``NAME=value`` pairs whose name is secret, bearer tokens and a few
well-known token formats (Hugging Face ``hf_...``, GitHub ``ghp_...``, AWS access key ids,
JSON web tokens, ...).

    >>> from distenv.core.redact import redact_value, redact_text
    >>> redact_value("HF_TOKEN", "hf_abc")
    '<redacted>'
    >>> redact_text("MASTER_ADDR='https://me:pw@host' is not a host name")
    "MASTER_ADDR='https://me:<redacted>@host' is not a host name"

Standard library only; compiled patterns are built on first use.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    _Patterns = tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...]

MASK = "<redacted>"

#: Whole words (names split on "_") that make a variable secret.
SECRET_WORDS = frozenset({
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASSPHRASE",
    "PWD", "PASS", "KEY", "KEYS", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "CREDENTIAL",
    "CREDENTIALS", "CREDS", "COOKIE", "COOKIES", "SAS", "SIGNATURE", "AUTH", "AUTHORIZATION",
    "BEARER", "SSHPASS",
})
#: Name prefixes whose every variable is secret (AWS_REGION too: simpler than a list).
SECRET_PREFIXES = ("AWS_",)
#: Substrings that make any name secret (``*PASSWORD*``: ``MYPASSWORDFILE``).
SECRET_PARTS = ("PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "CONNECTION_STRING",
                "CONNECTIONSTRING", "PRIVATE_KEY")
#: Word endings that make a word secret (``APITOKEN``, ``ACCESSTOKEN``, ``HFTOKEN``).
SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "ACCESSKEY",
                  "SECRETKEY")
#: Names that contain a secret-looking word but are not secret.
NOT_SECRET = frozenset({"PWD", "OLDPWD", "TOKENIZERS_PARALLELISM", "KEYTIMEOUT",
                        "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "SLURM_TRES_PER_TASK",
                        # AWS Batch's placement (sources/aws_batch.py), shown in its errors
                        "AWS_BATCH_JOB_ID", "AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES",
                        "AWS_BATCH_JOB_MAIN_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"})
#: Query/assignment keys inside values whose value is secret.
SECRET_KEYS = ("sig", "signature", "token", "access_token", "refresh_token", "id_token",
               "api_key", "apikey", "key", "secret", "client_secret", "password", "passwd",
               "sas", "sv_sig", "x-amz-signature", "x-amz-security-token",
               "x-goog-signature", "auth", "authorization", "credential", "credentials",
               "accountkey", "sharedaccesskey")


def is_secret_name(name: str) -> bool:
    """Does this variable (or key) name say its value is a secret?"""
    upper = name.upper().replace("-", "_").replace(".", "_")
    if upper in NOT_SECRET:
        return False
    if upper.startswith(SECRET_PREFIXES) or any(part in upper for part in SECRET_PARTS):
        return True
    for word in upper.split("_"):
        if word in SECRET_WORDS:
            return True
        if word.endswith(SECRET_ENDINGS) and word != "TOKENIZERS":
            return True
    return False


_PATTERNS: "_Patterns | None" = None


def _patterns() -> "_Patterns":
    global _PATTERNS
    if _PATTERNS is None:
        keys = "|".join(re.escape(k) for k in sorted(SECRET_KEYS, key=len, reverse=True))
        _PATTERNS = (
            # "Authorization: Bearer xyz", "Bearer xyz"
            (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}"),
             lambda m: f"{m.group(1)} {MASK}"),
            # scheme://user:password@host  ->  scheme://user:<redacted>@host
            (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@'\"]*):([^\s@/'\"]+)@"),
             lambda m: f"{m.group(1)}:{MASK}@"),
            # user:password@host without a scheme (a MASTER_ADDR, a host list fragment)
            (re.compile(r"(?<![A-Za-z0-9+.\-])([A-Za-z0-9._~\-]+):([^\s@/'\":]+)@(?=[A-Za-z0-9\[])"),
             lambda m: f"{m.group(1)}:{MASK}@"),
            # scheme://token@host (a bare secret as the user part of a URL)
            (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)((?:hf_|ghp_|gho_|ghs_|github_pat_|glpat-|"
                        r"sk-|xox[abposr]-)[^\s@/'\"]+)@"),
             lambda m: f"{m.group(1)}{MASK}@"),
            # ?sig=...&token=... and key=value pairs with a secret key, in URLs and text; the
            # key may be quoted ("auth":"v", JSON in a variable)
            (re.compile(r"(?i)(?<![a-z0-9_])(" + keys + r")(['\"]?\s*[=:]\s*)(?!<redacted>)"
                        r"(['\"]?)([^\s&;,'\"]+)"),
             lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}"),
            # A command line's secret option and its separate value: --password X, --token X
            (re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.\-]*)(\s+)(?!-)(?!<redacted>)(['\"]?)([^\s'\"]+)"),
             lambda m: (f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}"
                        if is_secret_name(m.group(1).lstrip("-")) else m.group(0))),
            # A password glued to its flag, -pX, where the program takes one so (sshpass,
            # mysql, mariadb): elsewhere -p starts launcher options (-pmi-port, -ppn)
            (re.compile(r"(?i)\b((?:sshpass|mysql|mysqldump|mysqladmin|mariadb)\b[^\n|;&]*?"
                        r"(?<![\w-])-p)(\s*)(?!<redacted>)([^\s'\"]+)"),
             lambda m: f"{m.group(1)}{m.group(2)}{MASK}"),
            # Well-known token formats, wherever they appear.
            (re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                        r"|glpat-[A-Za-z0-9_\-]{16,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
                        r"|sk-[A-Za-z0-9_\-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
                        r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+)"),
             lambda m: MASK),
        )
    return _PATTERNS


_ASSIGN: "re.Pattern[str] | None" = None


def _assign() -> "re.Pattern[str]":
    global _ASSIGN
    if _ASSIGN is None:
        # NAME=value, NAME='value', "name": "value", --name=value -- for any NAME
        _ASSIGN = re.compile(
            r"(?<![A-Za-z0-9_.])([\"']?)([A-Za-z_][A-Za-z0-9_.\-]*)\1(\s*[=:]\s*)"
            r"(?:'([^']*)'|\"([^\"]*)\"|([^\s,;&}\]\)'\"]+))")
    return _ASSIGN


def _assignments(text: str) -> str:
    """Mask the value of every NAME=value (or "name": "value") pair whose NAME is secret.
    A pair with another name is stepped over without consuming its value, so a secret
    nested inside it (JSON in a variable) is still found."""
    pattern, out, pos = _assign(), [], 0
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        if not is_secret_name(m.group(2)):
            out.append(text[pos:m.end(3)])
            pos = m.end(3)
            continue
        quote = "'" if m.group(4) is not None else '"' if m.group(5) is not None else ""
        value = next(v for v in m.group(4, 5, 6) if v is not None)
        out.append(text[pos:m.end(3)])
        out.append(f"{quote}{MASK if value else ''}{quote}")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def scrub(text: str) -> str:
    """Hide secret-looking parts of free text or of a value: secret NAME=value pairs,
    URL credentials, secret query parameters, bearer tokens, well-known token formats."""
    if not text:
        return text
    for pattern, repl in _patterns():
        text = pattern.sub(repl, text)
    return _assignments(text)


def redact_value(name: str, value: object) -> "str | None":
    """The value to show for variable `name`: masked whole when the name is secret."""
    if value is None:
        return value
    text = value if isinstance(value, str) else str(value)
    if is_secret_name(name):
        return MASK if text else text
    return scrub(text)


def redact_text(text: str) -> str:
    """Scrub a message (an error, a log line) of everything that looks like a secret."""
    return scrub(text)


def redact_environ(environ: "Mapping[str, str]", names: "Iterable[str] | None" = None
                   ) -> "dict[str, str | None]":
    """{name: shown value} for `names` (default: every variable) of a mapping."""
    keys = sorted(environ) if names is None else [n for n in names if n in environ]
    return {k: redact_value(k, environ[k]) for k in keys}
