"""Cloud Logging's query language, the part the Logging sink's filter uses, to
evaluate it against log entries: comparisons `FIELD="value"` (equal) and
`FIELD:"value"` (has: the value contains the text, case-insensitive) of a
dotted field path, NOT, AND, OR and parentheses.

Logging binds OR tighter than AND (`a AND b OR c` is `a AND (b OR c)`), the
reverse of most languages. A filter that mixes AND and OR at one level
without parentheses reads differently to the two, so it is refused here:
anything else this module does not know is an error too, never a silent
match.
"""

from __future__ import annotations

import re
from typing import Any

TOKEN = re.compile(r'\s*(?:(\()|(\))|(AND|OR|NOT)\b|([A-Za-z_][A-Za-z0-9_.]*)\s*(=|:)\s*"((?:[^"\\]|\\.)*)")')


class FilterError(Exception):
    """The filter holds something this evaluator does not understand."""


def tokens(text: str) -> list[tuple[str, ...]]:
    found = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise FilterError(f"cannot read the filter at {text[pos : pos + 40]!r}")
        if m.group(1):
            found.append(("(",))
        elif m.group(2):
            found.append((")",))
        elif m.group(3):
            found.append((m.group(3),))
        else:
            found.append(("cmp", m.group(4), m.group(5), m.group(6).replace('\\"', '"')))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return found


def _field(entry: dict[str, Any], path: str) -> Any:
    value: Any = entry
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, ...] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, ...]:
        token = self.peek()
        if token is None:
            raise FilterError("the filter ends too early")
        self.pos += 1
        return token

    def group(self):
        """Operands joined by one operator: AND and OR may not mix at one level."""
        operands = [self.unary()]
        operator = None
        while self.peek() is not None and self.peek()[0] in ("AND", "OR"):
            op = self.take()[0]
            if operator is not None and op != operator:
                raise FilterError("AND and OR mixed without parentheses: Logging binds OR tighter, parenthesise")
            operator = op
            operands.append(self.unary())
        if operator is None:
            return operands[0]
        if operator == "AND":
            return lambda e: all(o(e) for o in operands)
        return lambda e: any(o(e) for o in operands)

    def unary(self):
        token = self.take()
        if token[0] == "NOT":
            inner = self.unary()
            return lambda e: not inner(e)
        if token[0] == "(":
            inner = self.group()
            if self.take()[0] != ")":
                raise FilterError("a parenthesis is not closed")
            return inner
        if token[0] == "cmp":
            _, path, op, wanted = token
            if op == "=":
                return lambda e: _field(e, path) is not None and _text(_field(e, path)) == wanted
            return lambda e: _field(e, path) is not None and wanted.lower() in _text(_field(e, path)).lower()
        raise FilterError(f"unexpected {token[0]!r}")


def compile_filter(text: str):
    """A function of a log entry (a dict): whether the filter admits it."""
    parser = _Parser(text)
    matcher = parser.group()
    if parser.peek() is not None:
        raise FilterError(f"unexpected {parser.peek()[0]!r} after a complete filter")
    return matcher
