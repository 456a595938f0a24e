"""The regular expressions an adapter_config.json carries, matched in linear time.

PEFT lets `target_modules` be a regex and treats the keys of `rank_pattern` and
`alpha_pattern` as regexes. They come from the uploaded artifact, so they are
hostile input: with Python's backtracking `re`, one nested quantifier such as
`(a+)+$` against a long module name pinned the web process at 100% CPU for
minutes (issue 14). RE2 matches in time linear in the subject and refuses the
features that need backtracking (backreferences, lookaround), so every pattern
is compiled with it, under a bound on length, count and compiled size.
"""

from __future__ import annotations

import re2

from .errors import ArtifactRejected

# Real PEFT configs hold short patterns (module paths, small alternations over
# layer numbers); these bounds are far above them and keep a hostile config's
# compile and match cost small.
MAX_PATTERN_CHARS = 2048
MAX_PATTERN_KEYS = 4096
# RE2's memory budget per compiled pattern (its own default is 8 MiB).
MAX_PATTERN_MEMORY = 8 * 1024**2


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False  # a refused pattern is the uploader's problem, not a log line
    return options


def _reason(error: Exception) -> str:
    reason = error.args[0] if error.args else error
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    return str(reason)


def _bounded(pattern: str, where: str, code: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ArtifactRejected(
            code,
            f"{where} is {len(pattern)} characters long; patterns are limited to "
            f"{MAX_PATTERN_CHARS} characters.",
        )


def _refused(where: str, code: str, error: Exception) -> ArtifactRejected:
    return ArtifactRejected(
        code,
        f"{where} is not a regular expression the registry accepts ({_reason(error)}). "
        "Patterns are matched with RE2: backreferences and lookaround are not "
        "supported; list the module names instead.",
    )


def compile_target_modules(pattern: str) -> re2._Regexp:
    """PEFT's string `target_modules`: re.fullmatch against each module path."""
    where = f"target_modules {pattern[:80]!r}"
    _bounded(pattern, where, "invalid_target_modules")
    try:
        return re2.compile(pattern, _options())
    except re2.error as error:
        raise _refused(where, "invalid_target_modules", error) from None


class PatternKeys:
    """The keys of rank_pattern or alpha_pattern, matched as PEFT's get_pattern_key
    does: the first key, in config order, whose regex matches the end of the
    module path at a dot boundary.

    All keys go into one RE2 set, so a module path is scanned once however many
    keys there are (a loop over keys per module would cost keys x modules).
    """

    def __init__(self, field: str, keys: list[str]):
        self.field = field
        self.keys = list(keys)
        if len(self.keys) > MAX_PATTERN_KEYS:
            raise ArtifactRejected(
                f"invalid_{field}",
                f"{field} has {len(self.keys)} keys; at most {MAX_PATTERN_KEYS} are accepted.",
            )
        self._set = None
        if not self.keys:
            return
        self._set = re2.Set.FullMatchSet(_options())
        for key in self.keys:
            where = f"{field} key {key[:80]!r}"
            _bounded(key, where, f"invalid_{field}")
            try:
                # Compiled alone first: a set's error would not say which key failed.
                re2.compile(key, _options())
                self._set.Add(rf"(?:.*\.)?(?:{key})")
            except re2.error as error:
                raise _refused(where, f"invalid_{field}", error) from None
        try:
            self._set.Compile()
        except re2.error as error:
            raise ArtifactRejected(
                f"invalid_{field}",
                f"The keys of {field} together are too complex to match ({_reason(error)}).",
            ) from None

    def first_match(self, path: str) -> str | None:
        if self._set is None:
            return None
        try:
            found = self._set.Match(path)
        except re2.error as error:
            raise ArtifactRejected(
                f"invalid_{self.field}",
                f"The keys of {self.field} are too complex to match ({_reason(error)}).",
            ) from None
        return self.keys[min(found)] if found else None
