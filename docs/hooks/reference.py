"""MkDocs hook: the CLI and spec references, generated when the site is built (never written by hand).

A page holding the marker `<!-- archspec:cli-reference -->` gets every command of `archspec.cli.cli` (walked the way
click builds `--help`: usage, help text, each option's flags, type and default); one holding
`<!-- archspec:spec-reference -->` or `<!-- archspec:sweep-reference -->` gets every field of the JSON Schema that
`archspec schema` (or `archspec schema --sweep`) prints: its type, default, limits and description.

The archspec documented is the one in this checkout (its root goes first on sys.path), not whatever is installed.
Neither generator imports torch. tests/test_docs.py calls `cli_markdown` and `schema_markdown` directly.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _this_checkout() -> None:
    """This checkout's archspec first on sys.path (MkDocs restores sys.path after loading a hook, so this is done
    when a reference is made, not at import)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))

MARKERS = {
    "<!-- archspec:cli-reference -->": lambda: cli_markdown(),
    "<!-- archspec:spec-reference -->": lambda: schema_markdown(sweep=False),
    "<!-- archspec:sweep-reference -->": lambda: schema_markdown(sweep=True),
}


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook signature)
    # A note for readers of the unbuilt file (on GitHub: "this page is generated") has no place in the site.
    markdown = re.sub(r"<!-- unbuilt -->.*?<!-- /unbuilt -->\n?", "", markdown, flags=re.S)
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return table_pipes(markdown)


def table_pipes(markdown: str) -> str:
    """A table cell's code span holding an escaped pipe (`a\\|b`, as GitHub wants it) becomes <code>a&#124;b</code>:
    Python-Markdown's tables would keep the backslash inside the code."""
    def line_of_table(line: str) -> str:
        pieces = line.split("`")
        if len(pieces) % 2 == 0:  # an odd number of backticks: not plain code spans, left alone
            return line
        out = pieces[0]
        for i in range(1, len(pieces), 2):
            code, after = pieces[i], pieces[i + 1]
            if "\\|" in code:
                text = code.replace("\\|", "|").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                out += "<code>" + text.replace("|", "&#124;") + "</code>" + after
            else:
                out += "`" + code + "`" + after
        return out

    return "\n".join(line_of_table(line) if line.startswith("|") else line for line in markdown.split("\n"))


# ── The CLI ───────────────────────────────────────────────────────────────────────────────────────────────────────────


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, angle brackets as entities."""
    text = re.sub(r"\s+", " ", text).strip().replace("|", "\\|")
    pieces = text.split("`")  # angle brackets outside code spans would read as HTML; inside them they are text
    for i in range(0, len(pieces), 2):
        pieces[i] = pieces[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def _help_text(command) -> str:
    """A command's help as Markdown paragraphs: click's `\\b` blocks (kept as written) become code blocks, `\\f` ends
    the help as it does for click."""
    text = inspect.cleandoc(command.help or "").split("\f")[0]
    out = []
    for para in re.split(r"\n\s*\n", text):
        if para.startswith("\b"):
            out.append("```text\n" + para.lstrip("\b").strip("\n") + "\n```")
        else:
            out.append(re.sub(r"\s*\n\s*", " ", para.strip()))
    return "\n\n".join(p for p in out if p)


def _commands(group, ctx, path):
    """(path, command, context) for the group and every command under it, depth first in `--help` order."""
    import click

    yield path, group, ctx
    if isinstance(group, click.Group):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            sub = command.make_context(name, [], parent=ctx, resilient_parsing=True)
            yield from _commands(command, sub, [*path, name])


def cli_markdown() -> str:
    import click

    _this_checkout()
    from archspec.cli import cli

    root = cli.make_context("archspec", [], resilient_parsing=True)
    parts = []
    for path, command, ctx in _commands(cli, root, ["archspec"]):
        name = " ".join(path)
        level = "#" * min(len(path) + 1, 4)
        parts.append(f"{level} {name}\n")
        pieces = " ".join(command.collect_usage_pieces(ctx))
        parts.append(f"```text\nUsage: {name} {pieces}\n```\n")
        help_text = _help_text(command)
        if help_text:
            parts.append(help_text + "\n")
        rows = []
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:  # an argument (named in the usage line), or a hidden option
                continue
            flags, text = record
            rows.append(f"| `{_cell(flags)}` | {_cell(text)} |")
        if rows:
            parts.append("| option | description |\n|---|---|\n" + "\n".join(rows) + "\n")
        if isinstance(command, click.Group):
            names = [n for n in command.list_commands(ctx) if not getattr(command.get_command(ctx, n), "hidden", False)]
            links = ", ".join(f"[`{n}`](#{_slug(name + ' ' + n)})" for n in names)
            parts.append(f"Commands: {links}.\n")
    return "\n".join(parts)


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc extension makes of a heading (its default slugify, for ASCII headings)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


# ── The JSON Schema ───────────────────────────────────────────────────────────────────────────────────────────────────

_LIMITS = [("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"),
           ("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
           ("minItems", "at least {} items"), ("maxItems", "at most {} items"), ("pattern", "matches `{}`")]


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict, prefix: str) -> str:
    """A field's type in words, with links to the definitions it names."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{_slug(prefix + name)})"
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " \\| ".join(dict.fromkeys(_type(s, prefix) for s in schema[key]))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}), prefix)}"
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"mapping of name → {_type(values, prefix)}"
        return "mapping"
    if kind is None:
        return "any"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
            "null": "`null`"}.get(kind, kind)


def _limits(schema: dict) -> list[str]:
    found = [fmt.format(schema[key]) for key, fmt in _LIMITS if key in schema]
    for key in ("oneOf", "anyOf"):
        for sub in schema.get(key, []):
            found += _limits(sub)
    if schema.get("type") == "array":
        found += [f"items {x}" for x in _limits(schema.get("items", {}))]
    return list(dict.fromkeys(found))


def _default(prop: dict, required: bool) -> str:
    if "default" in prop:
        return f"`{json.dumps(prop['default'], ensure_ascii=False)}`"
    if required:
        return "required"
    return "its fields' defaults" if "$ref" in prop else "—"


def _refs(schema) -> list[str]:
    """The definitions a schema names, in the order it names them."""
    if isinstance(schema, dict):
        found = [_ref_name(schema["$ref"])] if "$ref" in schema else []
        for value in schema.values():
            found += _refs(value)
        return found
    if isinstance(schema, list):
        return [name for item in schema for name in _refs(item)]
    return []


def _table(schema: dict, prefix: str) -> str:
    required = set(schema.get("required", []))
    rows = []
    for field, prop in schema.get("properties", {}).items():
        description = prop.get("description", "")
        limits = _limits(prop)
        if limits:
            description = (description + "; " if description else "") + ", ".join(limits)
        rows.append(f"| `{field}` | {_type(prop, prefix)} | {_default(prop, field in required)} | "
                    f"{_cell(description) if description else ''} |")
    if not rows:
        return "No fields of its own.\n"
    return "| field | type | default | description |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def schema_markdown(sweep: bool = False) -> str:
    """Every definition reachable from the root, in the order a reader meets them (breadth first), each a table of
    its fields. A layer group's partial forms (`<Kind>Partial`: the same fields, each optional) are listed once, each
    naming the kind it refines."""
    _this_checkout()
    if sweep:
        from archspec.ablate.sweep import sweep_json_schema

        schema, title, prefix = sweep_json_schema(), "The sweep file", "sweep "
    else:
        from archspec.spec import json_schema

        schema, title, prefix = json_schema(), "The spec file", ""
    defs = schema.get("$defs", {})
    parts = [f"### {title}\n", _table(schema, prefix)]
    order, queue = [], _refs({k: v for k, v in schema.items() if k != "$defs"})
    while queue:
        name = queue.pop(0)
        if name in order or name not in defs:
            continue
        order.append(name)
        queue += _refs(defs[name])
    partial = [n for n in order if n.endswith("Partial") and n[: -len("Partial")] in defs]
    for name in order:
        if name in partial:
            continue
        body = defs[name]
        parts.append(f"### {prefix}{name}\n")
        if body.get("description"):
            parts.append(_cell(body["description"]) + "\n")
        parts.append(_table(body, prefix))
    if partial:
        parts.append(f"### {prefix}Layer group overrides\n")
        parts.append("A layer group's component is the kind's fields, each optional, merged onto the model-wide "
                     "component:\n")
        parts.append("\n".join(f"- <a id=\"{_slug(prefix + n)}\"></a>`{n}`: the fields of "
                               f"[{n[:-len('Partial')]}](#{_slug(prefix + n[:-len('Partial')])}), each optional"
                               for n in partial) + "\n")
    missing = set(defs) - set(order)
    for name in sorted(missing):  # defined but not reached from the root: still documented
        parts.append(f"### {prefix}{name}\n")
        parts.append(_table(defs[name], prefix))
    return "\n".join(parts)
