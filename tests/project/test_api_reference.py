"""The built API reference shows what a reader looks up, and nothing private.

The site is built once for this module, as ``scripts/docs.sh`` builds it (``mkdocs build
--strict``, from the repository's root, with this checkout's sources first on the path),
into a temporary directory; without the documentation tools (the docs extra) the module
is skipped. Then:

* every public msgspec struct of the rendered modules (``SourceOffsetEntry``,
  ``CheckpointManifest``, ``WorkerReport``, ...) shows its constructor and every field,
  each field with its description;
* the ``cairn`` page renders every name of ``cairn.__all__`` but the errors once, under
  a heading of its role, and the errors page every error;
* no page names a private module or constant (``cairn.protocol._lease``, ``_MOVED``,
  ``_lease.DEFAULT_LEASE``).
"""

from __future__ import annotations

import html
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from support.apipages import API_PAGES, rendered_modules
from support.paths import REPO

import cairn
from cairn import errors

pytest.importorskip("mkdocs", reason="the documentation tools (docs extra) are absent")
pytest.importorskip("mkdocstrings", reason="the documentation tools (docs extra) are absent")

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

API = API_PAGES
DIRECTIVE = re.compile(r"^::: ([\w.]+)$", re.MULTILINE)
PRIVATE = re.compile(
    r"cairn(?:\.\w+)*\._[a-z]\w*"  # a private module: cairn.protocol._lease
    r"|(?<![\w.])_[A-Z][A-Z0-9_]+\b"  # a private constant: _MOVED
    r"|(?<![\w.])_[a-z]\w*\.[A-Za-z]\w*"  # a name of a private module: _lease.DEFAULT_LEASE
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built with every warning an error."""
    out = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def text_of(site: Path, page: str) -> str:
    """The text of a built API page (``cairn`` for ``docs/api/cairn.md``), tags removed."""
    raw = (site / "api" / page / "index.html").read_text(encoding="utf-8")
    main = raw[raw.index('<article class="md-content__inner') : raw.index("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", main))


def section_of(site: Path, page: str, dotted: str) -> str:
    """The HTML of the object ``dotted`` on a built API page, to the next heading of its
    level or above."""
    raw = (site / "api" / page / "index.html").read_text(encoding="utf-8")
    start = raw.index(f'id="{dotted}"')
    level = raw.rfind("<h", 0, start)
    tag = raw[level : level + 3]
    following = re.compile(rf"<h[1-{tag[2]}][ >]")
    nxt = following.search(raw, start)
    return raw[start : nxt.start() if nxt else len(raw)]


def page_rendering(name: str) -> str:
    """The API page that renders module ``name`` (``cairn.md`` renders names of ``cairn``)."""
    for page in sorted(API.glob("*.md")):
        for dotted in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            if dotted == name or dotted.rpartition(".")[0] == name:
                return page.stem
    raise AssertionError(f"no API page renders {name}")


def public_structs() -> list[tuple[str, str, type[msgspec.Struct]]]:
    """``(module, name, struct)`` of every public msgspec struct of the rendered modules."""
    found = []
    seen: set[int] = set()
    for module_name in rendered_modules():
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            is_struct = isinstance(value, type) and issubclass(value, msgspec.Struct)
            if is_struct and id(value) not in seen:
                seen.add(id(value))
                found.append((module_name, name, value))
    return found


def test_there_are_public_structs_to_check() -> None:
    names = {name for _, name, _ in public_structs()}
    assert {"SourceOffsetEntry", "CheckpointManifest", "WorkerReport"} <= names


@pytest.mark.parametrize(
    ("module", "name", "struct"),
    [pytest.param(*found, id=f"{found[0]}.{found[1]}") for found in public_structs()],
)
def test_every_public_struct_shows_its_constructor_and_fields(
    site: Path, module: str, name: str, struct: type[msgspec.Struct]
) -> None:
    section = section_of(site, page_rendering(module), f"{module}.{name}")
    fields = [field.name for field in msgspec.structs.fields(struct)]
    signature = plain(section[: section.index("Bases:")])
    assert f"{name}(" in signature, signature
    positions = [signature.find(f"{field}:") for field in fields]
    assert -1 not in positions, f"the constructor lacks a field: {fields} in {signature}"
    assert positions == sorted(positions), "the constructor's fields are out of order"
    rows = {}
    for row in ROW.findall(section):
        cells = CELL.findall(row)
        rows[plain(cells[0]).strip()] = plain(cells[-1]).strip()
    for field in fields:
        assert rows.get(field), f"{name}.{field} has no described row among the fields {rows}"


ROW = re.compile(r'<tr class="doc-section-item">(.*?)</tr>', re.DOTALL)
CELL = re.compile(r"<td>(.*?)</td>", re.DOTALL)


def plain(fragment: str) -> str:
    """The text of an HTML fragment."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_cairn_page_renders_every_name_once_grouped_by_role(site: Path) -> None:
    page = (API / "cairn.md").read_text(encoding="utf-8")
    rendered = [dotted.removeprefix("cairn.") for dotted in DIRECTIVE.findall(page)]
    wanted = [n for n in cairn.__all__ if n not in errors.__all__ and n != "__version__"]
    assert sorted(rendered) == sorted(wanted)
    headings = re.findall(r"^## (.+)$", page, re.MULTILINE)
    assert headings[0] == "Checkpointers" and headings[-1] == "Errors", headings
    assert page.index("::: cairn.ObjectStoreCheckpointer") < page.index("## Errors")
    built = (site / "api" / "cairn" / "index.html").read_text(encoding="utf-8")
    for name in wanted:
        assert built.count(f'id="cairn.{name}"') == 1, name
    errors_page = (site / "api" / "errors" / "index.html").read_text(encoding="utf-8")
    for name in errors.__all__:
        assert f'id="cairn.errors.{name}"' in errors_page, name


def test_no_page_names_a_private_module_or_constant(site: Path) -> None:
    leaks = {}
    for page in sorted(API.glob("*.md")):
        text = text_of(site, page.stem)
        found = sorted({m.group(0) for m in PRIVATE.finditer(text)})
        if found:
            leaks[page.stem] = found
    assert leaks == {}
