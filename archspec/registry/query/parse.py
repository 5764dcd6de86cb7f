"""The filter and sort language of `runs list --where/--sort` and `specs list`: tokens, grammar, AST, and errors
with the column and a caret. Pure Python: nothing here imports SQLAlchemy (fields.py says what a name reads, sql.py
compiles the AST).

A hand-written tokenizer and recursive-descent parser turn the text into a small AST. Nothing from the text ever
becomes SQL: the compiler takes column names from an allow-list, and binds every field key and every literal.

Grammar (keywords are case-insensitive; NOT binds tighter than AND, AND tighter than OR):

    filter     := or_expr EOF
    or_expr    := and_expr ("OR" and_expr)*
    and_expr   := not_expr ("AND" not_expr)*
    not_expr   := "NOT" not_expr | "(" or_expr ")" | predicate
    predicate  := field op literal
                | field ["NOT"] "IN" "(" literal ("," literal)* ")"
                | field ["NOT"] "LIKE" string
                | field "IS" ["NOT"] "NULL"
    op         := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    literal    := number | string | "true" | "false"
    number     := -?digits[.digits][e[+-]digits]        (20e6, 3.2, -1, .5)
    string     := '...' | "..."                         (a doubled quote stands for itself: 'it''s')
    field      := segment ("." segment)*                 (a segment is [A-Za-z0-9_/-]+ or `back-quoted`)

    sort       := key ("," key)*        key := ["-"] field ["ASC" | "DESC"]      ("-" means DESC)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Union

from archspec.errors import UserError

# Limits: a filter is typed by a person; past these it is a mistake or an attack, and the database would refuse it
# anyway, less clearly (SQLite: "Expression tree is too large" at depth 1000, "too many terms in ORDER BY clause").
MAX_TEXT = 10_000  # characters of a filter or sort
MAX_NESTING = 50  # parentheses and NOTs, one inside another
MAX_PREDICATES = 200  # comparisons joined by AND / OR
MAX_VALUES = 1000  # literals in all IN lists together
MAX_SORT_KEYS = 16

# ── errors ───────────────────────────────────────────────────────────────────────────────────────────────────────


def text_literal(value: str) -> str:
    """`value` as a string literal of the filter language ('...' with '' for a quote): what code that builds a filter
    from a stored or given name must use (JSON's \\" and \\\\ escapes mean nothing here)."""
    return "'" + str(value).replace("'", "''") + "'"


class FilterError(UserError):
    """A bad filter or sort: the message names the column, and `problems` echo the text with a caret under it."""

    def __init__(self, what: str, text: str, pos: int, message: str):
        shown = re.sub(r"\s", " ", text)  # tabs and newlines would shift the caret
        pos = max(0, min(pos, len(text)))
        caret = pos
        if len(shown) > 200:  # a window around the column, so a long text stays one readable line
            start = max(0, min(pos - 100, len(shown) - 200))
            shown = ("..." if start else "") + shown[start:start + 200] + ("..." if start + 200 < len(shown) else "")
            caret = pos - start + (3 if start else 0)
        super().__init__(f"invalid {what} at column {pos + 1}: {message}", [shown, " " * caret + "^"])
        self.column = pos + 1


# ── tokens ───────────────────────────────────────────────────────────────────────────────────────────────────────

KEYWORDS = {"and", "or", "not", "in", "like", "is", "null", "true", "false", "asc", "desc"}
_SEGMENT = r"(?:[A-Za-z0-9_/\-]+|`(?:[^`]|``)+`)"
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z0-9_/`.]))
  | (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*")
  | (?P<field>(?:[A-Za-z_][A-Za-z0-9_/\-]*|`(?:[^`]|``)+`)(?:\.%s)*)
  | (?P<op><=|>=|!=|<>|==|=|<|>)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<comma>,)
  | (?P<minus>-)
    """
    % _SEGMENT,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # number | string | field | keyword | op | lparen | rparen | comma | minus | eof
    text: str
    pos: int  # 0-based column of the first character


def tokenize(text: str, what: str = "filter") -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            ch = text[pos]
            if ch in "'\"":
                raise FilterError(what, text, pos, f"unterminated string: no closing {ch}")
            if ch == "`":
                raise FilterError(what, text, pos, "unterminated `quoted` field name")
            raise FilterError(what, text, pos, f"unexpected character {ch!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            word = m.group()
            if kind == "field" and word.lower() in KEYWORDS:
                kind = "keyword"
            tokens.append(Token(kind, word, pos))
        pos = m.end()
    tokens.append(Token("eof", "", len(text)))
    return tokens


# ── AST ──────────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Field:
    name: str  # dotted, back-quotes removed
    pos: int


@dataclass(frozen=True)
class Literal:
    value: Union[str, float, bool]
    pos: int


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str  # = != < <= > >=
    value: Literal


@dataclass(frozen=True)
class In:
    field: Field
    values: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True)
class Like:
    field: Field
    pattern: Literal
    negated: bool


@dataclass(frozen=True)
class IsNull:
    field: Field
    negated: bool


@dataclass(frozen=True)
class And:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Or:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Not:
    item: "Node"


Node = Union[Compare, In, Like, IsNull, And, Or, Not]

_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _field_name(text: str) -> str:
    """`metrics.`val loss`` → `metrics.val loss`: split on dots outside back-quotes, unquote each segment."""
    parts, buf, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            if quoted and i + 1 < len(text) and text[i + 1] == "`":
                buf.append("`")
                i += 2
                continue
            quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    return ".".join(parts)


class _Parser:
    def __init__(self, text: str, what: str):
        self.text, self.what = text, what
        if len(text) > MAX_TEXT:
            raise FilterError(what, text, MAX_TEXT, f"{len(text):,} characters, more than the limit of {MAX_TEXT:,}")
        self.tokens = tokenize(text, what)
        self.i = 0
        self.depth = self.predicates = self.values = 0

    # helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str, tok: Token | None = None) -> FilterError:
        return FilterError(self.what, self.text, (tok or self.tok).pos, message)

    def is_kw(self, *words: str) -> bool:
        return self.tok.kind == "keyword" and self.tok.text.lower() in words

    def take(self) -> Token:
        tok = self.tok
        self.i += 1
        return tok

    def describe(self, tok: Token) -> str:
        return "the end of the filter" if tok.kind == "eof" else repr(tok.text)

    # grammar
    def parse_filter(self) -> Node:
        node = self.or_expr()
        if self.tok.kind != "eof":
            if self.tok.kind == "rparen":
                raise self.error("unbalanced ')'")
            raise self.error(f"expected AND, OR or the end of the filter, got {self.describe(self.tok)}")
        return node

    def or_expr(self) -> Node:
        items = [self.and_expr()]
        while self.is_kw("or"):
            self.take()
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def and_expr(self) -> Node:
        items = [self.not_expr()]
        while self.is_kw("and"):
            self.take()
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else And(tuple(items))

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"nested deeper than {MAX_NESTING} levels of parentheses and NOT")

    def not_expr(self) -> Node:
        # NOT chains are read in a loop, not by recursion; both count towards the nesting limit.
        nots = 0
        while self.is_kw("not"):
            self.take()
            self.nest()
            nots += 1
        node = self.operand()
        for _ in range(nots):
            node = Not(node)
        self.depth -= nots
        return node

    def operand(self) -> Node:
        if self.tok.kind == "lparen":
            open_tok = self.take()
            self.nest()
            node = self.or_expr()
            self.depth -= 1
            if self.tok.kind != "rparen":
                if self.tok.kind == "eof":
                    raise self.error(f"missing ')' to close the '(' at column {open_tok.pos + 1}")
                raise self.error(f"expected ')', AND or OR, got {self.describe(self.tok)}")
            self.take()
            return node
        return self.predicate()

    def field(self) -> Field:
        tok = self.tok
        if tok.kind != "field":
            if tok.kind == "keyword":
                raise self.error(f"expected a field name, got the keyword {tok.text.upper()}")
            raise self.error(f"expected a field name (e.g. params.model.n_layers), got {self.describe(tok)}")
        self.take()
        return Field(_field_name(tok.text), tok.pos)

    def literal(self) -> Literal:
        tok = self.tok
        if tok.kind == "number":
            self.take()
            value = float(tok.text)
            if not math.isfinite(value):  # 1e999, or a 5000-digit literal: no column holds it
                raise self.error(f"the number {tok.text[:20]}{'...' if len(tok.text) > 20 else ''} is out of range", tok)
            return Literal(value, tok.pos)
        if tok.kind == "string":
            self.take()
            quote = tok.text[0]
            value = tok.text[1:-1].replace(quote * 2, quote)
            _check_text(value, lambda m: FilterError(self.what, self.text, tok.pos, m))
            return Literal(value, tok.pos)
        if self.is_kw("true", "false"):
            self.take()
            return Literal(tok.text.lower() == "true", tok.pos)
        if tok.kind == "field":
            raise self.error(f"expected a value, got {tok.text!r}; quote text values: '{tok.text}'")
        raise self.error(f"expected a value (number, 'text', true or false), got {self.describe(tok)}")

    def predicate(self) -> Node:
        self.predicates += 1
        if self.predicates > MAX_PREDICATES:
            raise self.error(f"more than {MAX_PREDICATES} comparisons in one filter")
        field = self.field()
        tok = self.tok
        if tok.kind == "op":
            self.take()
            return Compare(field, _OPS[tok.text], self.literal())
        negated = False
        if self.is_kw("not"):
            self.take()
            negated = True
            if not self.is_kw("in", "like"):
                raise self.error(f"expected IN or LIKE after NOT, got {self.describe(self.tok)}")
        if self.is_kw("in"):
            self.take()
            if self.tok.kind != "lparen":
                raise self.error(f"expected '(' after IN, got {self.describe(self.tok)}")
            self.take()
            values = [self.literal()]
            while self.tok.kind == "comma":
                self.take()
                values.append(self.literal())
                if self.values + len(values) > MAX_VALUES:
                    raise self.error(f"more than {MAX_VALUES} values in IN lists")
            self.values += len(values)
            if self.tok.kind != "rparen":
                raise self.error(f"expected ',' or ')' in the IN list, got {self.describe(self.tok)}")
            self.take()
            return In(field, tuple(values), negated)
        if self.is_kw("like"):
            self.take()
            if self.tok.kind != "string":
                raise self.error(f"expected a quoted pattern after LIKE, got {self.describe(self.tok)}")
            return Like(field, self.literal(), negated)
        if self.is_kw("is"):
            self.take()
            neg = False
            if self.is_kw("not"):
                self.take()
                neg = True
            if not self.is_kw("null"):
                raise self.error(f"expected NULL after IS{' NOT' if neg else ''}, got {self.describe(self.tok)}")
            self.take()
            return IsNull(field, neg)
        raise self.error(
            f"expected an operator (= != < <= > >= IN LIKE IS) after {field.name!r}, got {self.describe(tok)}"
        )

    def parse_sort(self) -> list[tuple[Field, bool]]:
        keys: list[tuple[Field, bool]] = []
        while True:
            desc = False
            if self.tok.kind == "minus":
                self.take()
                desc = True
            field = self.field()
            if self.is_kw("asc", "desc"):
                desc = self.take().text.lower() == "desc"
            keys.append((field, desc))
            if len(keys) > MAX_SORT_KEYS:
                raise self.error(f"more than {MAX_SORT_KEYS} sort keys", self.tokens[self.i - 1])
            if self.tok.kind == "comma":
                self.take()
                continue
            if self.tok.kind != "eof":
                raise self.error(f"expected ',', ASC, DESC or the end of the sort, got {self.describe(self.tok)}")
            return keys


def _check_text(value: str, error: Callable[[str], FilterError]) -> None:
    # PostgreSQL refuses NUL in text, and no driver can send a lone surrogate: refuse both here, with a column,
    # rather than as a database error.
    if "\x00" in value:
        raise error("text values cannot contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error("text value is not valid Unicode") from None


def parse_filter(text: str | None) -> Node | None:
    """Parse a filter; None for an empty one. Raises FilterError (a UserError) with the column of the problem."""
    if text is None or not text.strip():
        return None
    return _Parser(text, "filter").parse_filter()


def parse_sort(text: str | None) -> list[tuple[Field, bool]]:
    """Parse `field [ASC|DESC], -field, ...` into (field, descending) pairs."""
    if text is None or not text.strip():
        return []
    return _Parser(text, "sort").parse_sort()


def _fields_of(node: Node | None) -> list[Field]:
    if node is None:
        return []
    if isinstance(node, (And, Or)):
        return [f for item in node.items for f in _fields_of(item)]
    if isinstance(node, Not):
        return _fields_of(node.item)
    return [node.field]



def referenced_fields(where: str | None = None, sort: str | None = None) -> list[str]:
    """Field names a filter and a sort mention, in order of appearance, without repeats (for display columns)."""
    names: list[str] = []

    def walk(node: Node) -> None:
        if isinstance(node, (And, Or)):
            for item in node.items:
                walk(item)
        elif isinstance(node, Not):
            walk(node.item)
        elif node.field.name not in names:
            names.append(node.field.name)

    node = parse_filter(where)
    if node is not None:
        walk(node)
    for f, _ in parse_sort(sort):
        if f.name not in names:
            names.append(f.name)
    return names

