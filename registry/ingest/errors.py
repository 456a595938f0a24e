"""The one error type the ingest library raises for a bad artifact."""

from __future__ import annotations


class ArtifactRejected(Exception):
    """Artifact failed validation; maps to an HTTP 4xx.

    `code` is a short snake_case identifier clients can branch on, `message` a
    sentence for a human naming the problem and, where there is one, the fix.
    `status` is 400, 413 when a size limit is exceeded, 415 for an unsupported
    upload type.
    """

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def __repr__(self) -> str:
        return f"ArtifactRejected({self.code!r}, {self.message!r}, status={self.status})"


class SourceRejected(ValueError):
    """A user-given source cannot be imported: missing, empty, too big, unsafe."""
