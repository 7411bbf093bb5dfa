"""cntkio's exceptions: one base class, one subclass per category, the position as attributes."""

from __future__ import annotations

import errno as _errno
from typing import Any, Dict, Optional


class CntkError(Exception):
    """Base class of every error cntkio raises about data, options or files.

    Attributes (``None`` where unknown): ``code`` (stable, e.g. ``"E0015"``), ``kind`` (e.g.
    ``"SparseIndexOutOfRange"``), ``category`` (``"format"``, ``"usage"``, ``"limit"``, ``"io"``,
    ``"internal"``),
    ``message`` (without the position), ``help``, and the position: ``path``, ``line`` and ``column``
    (1-based), ``byte`` (0-based offset), ``sequence_id``. ``str(e)`` is ``path:line:column: error[CODE]:
    message``.
    """

    category: Optional[str] = None
    code: Optional[str] = None
    kind: Optional[str] = None
    message: Optional[str] = None
    help: Optional[str] = None
    path: Optional[str] = None
    line: Optional[int] = None
    column: Optional[int] = None
    byte: Optional[int] = None
    sequence_id: Optional[int] = None
    display: Optional[str] = None

    def __str__(self) -> str:
        if self.display:
            return self.display
        return super().__str__()


class FormatError(CntkError, ValueError):
    """The input is wrong: a CTF parse error, a malformed CBF file, too many errors for ``maxErrors``."""

    category = "format"


class UsageError(CntkError, ValueError):
    """The caller is wrong: a stream definition, an option, an argument."""

    category = "usage"


class LimitError(CntkError):
    """The input asks for more than the limits allow (a sequence of 4 GiB or more, …)."""

    category = "limit"


class InternalError(CntkError, RuntimeError):
    """A bug in cntkio (code ``E9001``): one of its own invariants does not hold. Please report it."""

    category = "internal"


class IoError(CntkError, OSError):
    """Reading or writing a file failed (``errno``, ``strerror`` and ``filename`` as for ``OSError``)."""

    category = "io"


class NotFoundError(IoError, FileNotFoundError):
    """A file does not exist."""


class PermissionDeniedError(IoError, PermissionError):
    """A file may not be read or written."""


for _cls in (
    CntkError,
    FormatError,
    UsageError,
    LimitError,
    InternalError,
    IoError,
    NotFoundError,
    PermissionDeniedError,
):
    _cls.__module__ = "cntkio"

# A stable code's first digit is its category (E0xxx format, E1xxx usage, E2xxx I/O, E3xxx limit, E9xxx bug).
_BY_CODE_DIGIT = {"0": FormatError, "1": UsageError, "2": IoError, "3": LimitError, "9": InternalError}
_FIELDS = ("code", "kind", "message", "help", "path", "line", "column", "byte", "sequence_id", "display")


def _from_native(fields: Dict[str, Any]) -> CntkError:
    """Builds the exception for an error of the Rust library (called by the extension); its class follows
    from the stable code."""
    code = fields.get("code") or ""
    base = _BY_CODE_DIGIT.get(code[1:2], CntkError)
    exc: CntkError
    if base is IoError:
        cls: type = IoError
        io_kind = fields.get("io_kind")
        err = fields.get("errno")
        if io_kind == "NotFound" or err == _errno.ENOENT:
            cls = NotFoundError
        elif io_kind == "PermissionDenied" or err in (_errno.EACCES, _errno.EPERM):
            cls = PermissionDeniedError
        if err is None:
            exc = cls(fields["message"])
        else:
            exc = cls(err, fields["message"], fields.get("path"))
    else:
        exc = base(fields["message"])
    for name in _FIELDS:
        setattr(exc, name, fields.get(name))
    return exc
