"""The docs stay true to the code: every setting, error class and table is documented, and links resolve."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import db.models
import polar.errors
from db.models import Base
from polar.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_every_setting_is_in_the_settings_table():
    table = (DOCS / "settings.md").read_text()
    variables = [str(f.validation_alias or f"POLAR_{name.upper()}") for name, f in Settings.model_fields.items()]
    missing = [variable for variable in variables if f"`{variable}`" not in table]
    assert not missing, f"document these in docs/settings.md: {missing}"


def test_the_error_tree_names_every_error_class():
    doc = polar.errors.__doc__ or ""
    classes = {
        name
        for name, cls in vars(polar.errors).items()
        if inspect.isclass(cls) and issubclass(cls, polar.errors.PolarError) and cls.__module__ == "polar.errors"
    }
    named = set(re.findall(r"\b([A-Z][A-Za-z]+)\b", doc.split("In the rollout pipeline")[0]))
    assert classes - named == set(), "add these to the tree in polar/errors.py's docstring"
    assert {n for n in named if n.endswith(("Error", "Exceeded", "Failed"))} <= classes  # no stale names


def test_the_data_model_lists_exactly_the_orm_tables():
    tables = set(Base.metadata.tables)
    doc = (DOCS / "data-model.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", doc.split("## Tables")[1].split("\n## ")[0], re.MULTILINE))
    assert listed == tables
    models_doc = db.models.__doc__ or ""
    assert {t for t in tables if f"``{t}``" not in models_doc} == set()


def test_relative_links_in_the_docs_resolve():
    broken = []
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


def test_every_test_the_docs_name_exists():
    """A doc that says which test shows a claim (``tests/x.py`` or ``tests/x.py::test_name``) names a real one."""
    missing = []
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for path, name in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", page.read_text()):
            source = ROOT / path
            if not source.exists() or (name and not re.search(rf"def {name}\b", source.read_text())):
                missing.append(f"{page.relative_to(ROOT)}: {path}{'::' + name if name else ''}")
    assert not missing


def test_nothing_points_outside_the_repository():
    hits = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for top in ("polar", "db", "flows", "harness_adapters", "docs", "tests", "benchmarks", "scripts", "examples")
        for path in (ROOT / top).rglob("*")
        if path.suffix in {".py", ".md", ".sh", ".toml", ".yaml"} and path != Path(__file__).resolve()
        for line in path.read_text(errors="replace").splitlines()
        if re.search(r"\bDESIGN\b|DESIGN\.md|\.\./shared", line)
    ]
    assert not hits
