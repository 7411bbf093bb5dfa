"""cntkio's exceptions: one base class, one subclass per category, the position as attributes."""

from __future__ import annotations

import errno as _errno
from typing import Any, Dict, Optional


class CntkError(Exception):
    """Base class of every error cntkio raises about data, options or files.

    Attributes (``None`` where unknown): ``code`` (stable, e.g. ``"E0015"``), ``kind`` (e.g.
    ``"SparseIndexOutOfRange"``), ``category`` (``"format"``, ``"usage"``, ``"limit"``, ``"io"``),
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


class IoError(CntkError, OSError):
    """Reading or writing a file failed (``errno``, ``strerror`` and ``filename`` as for ``OSError``)."""

    category = "io"


class NotFoundError(IoError, FileNotFoundError):
    """A file does not exist."""


class PermissionDeniedError(IoError, PermissionError):
    """A file may not be read or written."""


for _cls in (CntkError, FormatError, UsageError, LimitError, IoError, NotFoundError, PermissionDeniedError):
    _cls.__module__ = "cntkio"

_BY_CATEGORY = {"format": FormatError, "usage": UsageError, "limit": LimitError, "io": IoError}
_FIELDS = ("code", "kind", "message", "help", "path", "line", "column", "byte", "sequence_id", "display")


def _from_native(fields: Dict[str, Any]) -> CntkError:
    """Builds the exception for an error of the Rust library (called by the extension)."""
    category = fields.get("category") or "format"
    exc: CntkError
    if category == "io":
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
        exc = _BY_CATEGORY.get(category, CntkError)(fields["message"])
    for name in _FIELDS:
        setattr(exc, name, fields.get(name))
    return exc
