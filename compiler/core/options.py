"""How an error message names a user's option: as the user wrote it.

The same checks run under the CLI (``lumc compile --max-kl 0.1``) and from Python
(``lumc.compile(..., max_kl=0.1)``); a message naming ``--max-kl`` to a Python caller names an
option their call does not have. The CLI's command group runs its command under
:func:`cli_spelling` (a context variable, reset when the command ends, so a Python caller in the
same process, a test after a ``CliRunner`` call, keeps the keyword spelling).
"""
from __future__ import annotations

import contextlib
import contextvars

_CLI = contextvars.ContextVar("lumc_cli_spelling", default=False)
# CLI option -> the keyword argument of lumc.compile where the names differ
_KEYWORDS = {"shape": "shapes"}


@contextlib.contextmanager
def cli_spelling():
    """Within: messages name options as the CLI spells them."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def options(*pairs: tuple[str, object]) -> str:
    """Several ``(name, value)`` options as the user would give them together: ``--precision bf16
    --weights fp8`` at the CLI, ``precision='bf16', weights='fp8'`` from Python."""
    return (" " if _CLI.get() else ", ").join(option(n, v) for n, v in pairs)


def option(name: str, value=None) -> str:
    """Option ``name`` (the CLI's spelling, ``max-kl``) as the user gave it: ``--max-kl 0.1`` at
    the CLI, ``max_kl=0.1`` from Python (``value`` shown as given there; ``shape``: ``shapes``);
    ``--max-kl`` / ``max_kl`` without a value."""
    if _CLI.get():
        return f"--{name}" if value is None else f"--{name} {value}"
    kw = _KEYWORDS.get(name, name.replace("-", "_"))
    return kw if value is None else f"{kw}={value!r}"
