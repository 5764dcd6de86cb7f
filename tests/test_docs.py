"""The documentation tells the truth: its runnable examples run, the options it names exist, the paths it names
exist, ARCHITECTURE names every package, the generated references cover every command and field, and nothing cites a
file outside the repository.

A fenced ```bash or ```python block right after a `<!-- runnable -->` line (in README.md or any page under docs/) is
executed here, in order within its page, on the tiny presets: in a scratch project directory (a copy of `specs/`, its
own registry and runs), with every `--steps N` cut to 2. Shell lines must be `archspec ...` commands; they run
in-process through `archspec.cli.main` (one interpreter: seconds, not a start-up per line) and must exit 0."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from archspec.cli import cli, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MARKER = "<!-- runnable -->"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ── Runnable examples ─────────────────────────────────────────────────────────────────────────────────────────────────


def runnable_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line) of every fenced block that follows a runnable marker (blank lines between allowed)."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = re.match(r"^```(\w+)", lines[j]) if j < len(lines) else None
        assert fence, f"line {i + 1}: {MARKER} must be followed by a fenced code block"
        end = lines.index("```", j + 1)
        blocks.append((fence.group(1), "\n".join(lines[j + 1:end]), j + 1))
    return blocks


def shell_commands(code: str) -> list[list[str]]:
    """Each command of a runnable shell block as argv (continuation lines joined, comments dropped)."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append(argv)
    return commands


TRAINS = {"train", "ablate", "mup-check"}  # the commands that train (and so evaluate) unless --dry-run
QUICK_EVAL = ["--set", "train.eval_tokens=1024"]


def quick(argv: list[str]) -> list[str]:
    """The command a test can afford: every `--steps N` becomes `--steps 2`, and a command that trains evaluates on
    1,024 validation tokens instead of 65,536 (evaluation is not part of a run's identity; on a loaded 2-core box it
    is most of a tiny run's time). Options and files stay as written."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--steps":
            out[i + 1] = "2"
    if out and out[0] in TRAINS and "--dry-run" not in out:
        out += QUICK_EVAL
    return out


def trains(page: Path) -> bool:
    return any(language == "bash" and any(quick(argv[1:])[-len(QUICK_EVAL):] == QUICK_EVAL
                                          for argv in shell_commands(code))
               for language, code, _ in runnable_blocks(page.read_text()))


PAGES_WITH_EXAMPLES = [p for p in PAGES if runnable_blocks(p.read_text())]
# A page whose examples train takes tens of seconds (a few tiny runs, each built, trained, evaluated and recorded):
# slow. Pages that only build, plan or query stay in the quick suite.
EXAMPLE_PARAMS = [pytest.param(p, marks=[pytest.mark.slow] if trains(p) else [], id=_rel(p)) for p in PAGES_WITH_EXAMPLES]


def test_the_docs_mark_examples_runnable():
    """The tour and the guides' examples are marked: a page losing its marker would silently stop being tested."""
    names = {_rel(p) for p in PAGES_WITH_EXAMPLES}
    for page in ["README.md", "docs/guides/training.md", "docs/guides/fair-comparisons.md",
                 "docs/guides/ablations.md", "docs/guides/registry.md", "docs/guides/hf.md", "docs/guides/sampling.md",
                 "docs/guides/quantization.md", "docs/guides/specs.md", "docs/guides/parallel.md"]:
        assert page in names, f"{page} has no runnable example"


def test_the_quickstart_tour_is_the_readmes():
    """The quickstart repeats the README's tour word for word (the README's copy is the one run here)."""
    readme = [code for language, code, _ in runnable_blocks((ROOT / "README.md").read_text()) if language == "bash"]
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    tour = re.search(r"<!-- the README's tour: run by tests/test_docs.py there -->\n```bash\n(.*?)\n```", quickstart, re.S)
    assert tour and tour.group(1) == readme[0]


def test_a_marker_without_a_block_is_refused():
    with pytest.raises(AssertionError, match="must be followed by a fenced code block"):
        runnable_blocks(f"{MARKER}\n\nplain text\n")
    assert runnable_blocks(f"{MARKER}\n```bash\narchspec schema\n```\n") == [("bash", "archspec schema", 2)]
    assert shell_commands("archspec train a.yaml \\\n  --steps 100  # comment\n\n# only a comment\n") == [
        ["archspec", "train", "a.yaml", "--steps", "100"]]
    assert quick(["train", "a.yaml", "--steps", "100"]) == ["train", "a.yaml", "--steps", "2", *QUICK_EVAL]
    assert quick(["ablate", "s.yaml", "--dry-run"]) == ["ablate", "s.yaml", "--dry-run"]


@pytest.mark.parametrize("page", EXAMPLE_PARAMS)
def test_runnable_examples_run(page, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    # The scratch directory is the project (it holds specs/): its registry, runs and generated modules land in it,
    # as they would in a reader's checkout. Caches stay the session's.
    monkeypatch.delenv("ARCHSPEC_HOME", raising=False)
    monkeypatch.delenv("ARCHSPEC_REGISTRY", raising=False)
    for language, code, line in runnable_blocks(page.read_text()):
        where = f"{_rel(page)}:{line}"
        if language == "bash":
            for argv in shell_commands(code):
                assert argv[0] == "archspec", f"{where}: a runnable block holds archspec commands only, got {argv[0]!r}"
                rc = main(quick(argv[1:]))
                out = capsys.readouterr()
                assert rc == 0, f"{where}: {shlex.join(argv)} exited {rc}\n{out.out[-2000:]}\n{out.err[-2000:]}"
        elif language == "python":
            exec(compile(code, where, "exec"), {"__name__": "__docs__"})  # noqa: S102 (the docs' own example)
        else:
            pytest.fail(f"{where}: a runnable block is bash or python, not {language}")


# ── Options and paths the docs name ───────────────────────────────────────────────────────────────────────────────────


def _command_options() -> dict[tuple[str, ...], click.Command]:
    """Every command by its path of names: ("runs", "list") -> the click command."""
    found = {}

    def walk(group, ctx, path):
        found[path] = group
        if isinstance(group, click.Group):
            for name in group.list_commands(ctx):
                command = group.get_command(ctx, name)
                walk(command, click.Context(command, info_name=name, parent=ctx), (*path, name))

    walk(cli, click.Context(cli, info_name="archspec"), ())
    return found


COMMANDS = _command_options()


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")} | {"--help",
                                                                                                           "-h"}


def _snippets(text: str):
    """(line number, text) of every inline code span and every code-block line (continuations joined)."""
    in_block = False
    block = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if in_block:
                yield from ((start, s) for start, s in block)
                block = []
            in_block = not in_block
            continue
        if in_block:
            if block and block[-1][1].endswith("\\"):
                block[-1] = (block[-1][0], block[-1][1][:-1] + " " + line)
            else:
                block.append((n, line))
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


def named_commands(snippet: str):
    """(command path, options named) for each `archspec COMMAND ...` in a snippet, up to `&&`, `;`, `#` or `>`."""
    for match in re.finditer(r"(?:^|[\s/(])archspec\s+(.*)", snippet):
        tokens = re.split(r"\s+", re.split(r"&&|;|\s#|>", match.group(1))[0].strip())
        path: tuple[str, ...] = ()
        options = []
        for token in tokens:
            token = token.strip("[](),.`'\"")
            if token.startswith("--") or re.fullmatch(r"-[a-zA-Z]", token):
                options.append(token.split("=", 1)[0])
                continue
            if not options and isinstance(COMMANDS.get(path), click.Group):
                for alternative in re.split(r"\\?\|", token):
                    if (*path, alternative) in COMMANDS:
                        path = (*path, alternative)
                        break
        if path:
            yield path, options


def test_every_option_the_docs_name_exists():
    problems = []
    for page in PAGES:
        for n, snippet in _snippets(page.read_text()):
            for path, options in named_commands(snippet):
                have = _options(COMMANDS[path])
                problems += [f"{_rel(page)}:{n}: archspec {' '.join(path)} has no option {opt}"
                             for opt in options if opt not in have]
    assert not problems, "\n".join(problems)


def test_the_option_check_can_fail():
    assert list(named_commands("archspec train specs/x.yaml --steps 2 --no-such")) == [
        (("train",), ["--steps", "--no-such"])]
    assert list(named_commands("archspec runs list\\|export [--where F]")) == [(("runs", "list"), ["--where"])]
    assert "--no-such" not in _options(COMMANDS[("train",)])


REPO_TOP = ("archspec", "tests", "specs", "bench", "docs", "generated", "scripts", ".ci")
# Paths the docs write inside the package without its name (`kinds/ffn/activations.py`): checked under archspec/.
PACKAGE_DIRS = tuple(sorted(p.name for p in (ROOT / "archspec").iterdir() if (p / "__init__.py").exists()))


def named_paths(text: str) -> set[str]:
    """Repository paths a page names (in code spans, code blocks or links), without placeholders or globs; a path
    that starts at one of the package's folders is read as under archspec/."""
    found = set()
    tops = "|".join(re.escape(t) for t in (*REPO_TOP, *PACKAGE_DIRS))
    for match in re.finditer(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % tops, text):
        path = match.group(1)
        if re.search(r"[<>*{}]", text[match.end():match.end() + 1] + path):
            continue
        if path.split("/", 1)[0] in PACKAGE_DIRS and path.split("/", 1)[0] not in REPO_TOP:
            if not path.endswith((".py", ".j2")):  # `registry/archspec.db` is the state folder, `ui/runs.png` an image
                continue
            path = "archspec/" + path
        found.add(path)
    return found


@pytest.mark.parametrize("page", ["docs/EXTENDING.md", "docs/ARCHITECTURE.md", "README.md", "docs/quickstart.md",
                                  "docs/index.md", *sorted(_rel(p) for p in (ROOT / "docs" / "guides").glob("*.md")),
                                  "docs/reference/commands.md"])
def test_every_repository_path_the_docs_name_exists(page):
    text = (ROOT / page).read_text()
    # What the page's own commands write (`-o specs/mine.yaml`) is not expected to exist beforehand.
    written = set(re.findall(r"(?:-o|--out|--run-dir|--checkpoint)\s+(\S+)", text))
    missing = sorted(p for p in named_paths(text) - written
                     if not (ROOT / p).exists() and not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"{page} names paths that do not exist: {missing}"


def test_the_path_check_can_fail():
    assert named_paths("see `archspec/kinds/nowhere.py` and archspec/kinds/<family>/<kind>.py") == {
        "archspec/kinds/nowhere.py"}
    assert named_paths("only `kinds/attention.py` and `my_kinds/relu2.py`") == {"archspec/kinds/attention.py"}


def test_extending_names_every_hook_of_the_kinds():
    """Every method and property a kind family's base class offers (archspec/kinds/base.py) is named in
    docs/EXTENDING.md, so a hook added to the contract cannot go undocumented."""
    import inspect

    import archspec.kinds.base as base

    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    families = [c for c in vars(base).values()
                if inspect.isclass(c) and c.__module__ == base.__name__ and issubclass(c, base.KindUnit)]
    assert len(families) >= 6  # KindUnit and the five families
    missing = [f"{c.__name__}.{name}" for c in families for name, value in vars(c).items()
               if not name.startswith("_") and (callable(value) or isinstance(value, (property, classmethod)))
               and not re.search(rf"\b{name}\b", text)]
    assert not missing, f"docs/EXTENDING.md does not name: {missing}"


def test_architecture_names_every_package():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(_rel(p.parent) + "/" for p in (ROOT / "archspec").rglob("__init__.py")
                      if p.parent != ROOT / "archspec")
    assert len(packages) >= 15
    missing = [p for p in packages if f"`{p}`" not in text and f"{p}" not in text]
    assert not missing, f"docs/ARCHITECTURE.md does not name: {missing}"


# ── The generated references ──────────────────────────────────────────────────────────────────────────────────────────


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_and_option():
    """Against click's own `--help` text (another path than the hook's walk): every command it lists has its
    heading, and every option flag of every command is in the page as the build makes it."""
    hook = _hook()
    page = hook.on_page_markdown((ROOT / "docs/reference/cli.md").read_text(), None, None, None)
    assert "<!-- archspec:" not in page and "Read as a plain file" not in page
    # GitHub's escaped pipe in a table's code span, as the site must show it (no backslash), other spans untouched
    assert hook.table_pipes("| `a\\|b` | x \\| `y` |") == "| <code>a&#124;b</code> | x \\| `y` |"
    assert "\\|" not in "".join(re.findall(r"<code>.*?</code>", page))
    for path, command in COMMANDS.items():
        name = " ".join(("archspec", *path))
        assert re.search(rf"^#+ {re.escape(name)}$", page, re.M), f"no section for {name}"
        help_text = command.get_help(click.Context(command, info_name=name))
        for flag in re.findall(r"^\s+(-[-\w, ]+?)(?:\s|$)", help_text, re.M):
            for opt in re.findall(r"--?[\w-]+", flag):
                assert f"{opt}" in page, f"{name}: {opt} missing from the CLI reference"


def test_the_spec_reference_has_every_field():
    from archspec.ablate.sweep import sweep_json_schema
    from archspec.spec import json_schema

    hook = _hook()
    page = hook.on_page_markdown((ROOT / "docs/reference/spec.md").read_text(), None, None, None)
    assert "<!-- archspec:" not in page
    for schema, prefix in ((json_schema(), ""), (sweep_json_schema(), "sweep ")):
        for name, body in schema["$defs"].items():
            if name.endswith("Partial"):
                assert f"`{name}`" in page
                continue
            section = page.split(f"### {prefix}{name}\n", 1)
            assert len(section) == 2, f"no section for {name}"
            rows = section[1].split("\n### ", 1)[0]
            for field, prop in body.get("properties", {}).items():
                row = re.search(rf"^\| `{re.escape(field)}` \|.*$", rows, re.M)
                assert row, f"{name}.{field} missing from the spec reference"
                if "default" in prop:
                    assert f"| `{__import__('json').dumps(prop['default'], ensure_ascii=False)}` |" in row.group(0)
                if prop.get("description"):
                    assert prop["description"].split()[0].replace("|", "\\|") in row.group(0)


# ── The README and the repository's boundary ──────────────────────────────────────────────────────────────────────────


def test_the_readme_is_short_and_ci_runs_its_test_command():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert lines[2] == "```bash" and lines[5] == "```"
    install, test = lines[3], lines[4]
    assert install.startswith("python3 -m venv .venv && ") and "archspec train" in install
    assert test in (ROOT / ".ci" / "run").read_text().splitlines(), "CI must run the README's test command verbatim"


def _repository_files() -> list[Path]:
    """The repository's files: tracked, or new and not ignored (a source tree without git: every file but scratch)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [ROOT / name for name in listed.stdout.splitlines()]
    scratch = {".git", ".venv", ".docs-venv", "site", "build", "dist", ".hypothesis", ".pytest_cache"}
    return [p for p in ROOT.rglob("*") if not scratch & set(p.relative_to(ROOT).parts)]


def test_nothing_cites_a_file_outside_the_repository():
    """The team's design notes are not part of the repository: no file may send a reader to them."""
    banned = re.compile("|".join(["DESIGN" + r"\.md", "STYLE" + r"\.md", r"\.\./" + "shared", "/work" + "/shared"]))
    hits = []
    files = _repository_files()
    assert any(p.name == "ARCHITECTURE.md" for p in files)
    for path in files:
        if not path.is_file() or path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".j2", ".sh", ".txt",
                                                     ".html", ".cfg", ".mako", ""}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if banned.search(line)]
    assert not hits, f"citations of files outside the repository: {hits}"


def test_the_readme_links_resolve():
    """MkDocs checks the site's links and anchors; the README lies outside the site, so its links are checked here:
    every relative link names a file of the repository, and every anchor a heading of that file."""
    slug = _hook()._slug
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 20
    problems = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.is_file():
            problems.append(f"{link}: no such file")
        elif anchor:
            headings = re.findall(r"^#+\s+(.+?)\s*$", target.read_text(), re.M)
            if anchor not in {slug(h) for h in headings}:
                problems.append(f"{link}: no heading with that anchor")
    assert not problems, problems


def test_the_tours_report_path_is_where_its_ablate_command_writes():
    """The tour's `ablate ... --steps N` writes its report under a budget folder (archspec.ablate.budgets.report_dir);
    the README and the quickstart named `reports/ffn/ffn.png`, the folder of the file's own budget."""
    from archspec.ablate.budgets import report_dir

    for page in ("README.md", "docs/quickstart.md"):
        text = (ROOT / page).read_text()
        command = re.search(r"archspec ablate specs/ablations/(\w+)\.yaml [^\n#]*--steps (\d+)", text)
        assert command, page
        name, steps = command.group(1), int(command.group(2))
        want = (report_dir(name, steps) / f"{name}.png").as_posix()
        named = set(re.findall(rf"`(reports/{name}/[^`]*\.png)`", text))
        assert named == {want}, (page, named, want)


def test_every_page_is_in_the_sites_nav():
    """`mkdocs build --strict` aborts on a page under docs/ that the nav leaves out (CI builds the site after the
    tests, so a page added without its nav line failed CI after a green suite): the nav and the pages agree here."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def targets(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from targets(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from targets(value)

    nav = set(targets(config["nav"]))
    docs = ROOT / config["docs_dir"]
    excluded = [line.strip() for line in config.get("exclude_docs", "").splitlines() if line.strip()]
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    pages = {p for p in pages if not any(p.startswith(e) for e in excluded)}
    pages |= {"reference/cli.md", "reference/spec.md"} & nav  # written by the build hook
    assert pages - nav == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries with no page: {sorted(nav - pages)}"
