"""mkdocs hooks: the configuration page from the settings' own descriptions, the benchmark's pages from
bench/ and the home page from README.md, so that each of them has one source."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, get_origin

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the settings of the tree being built, installed or not

from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_settings import BaseSettings  # noqa: E402

from shared.config import ClientSettings, GatewaySettings, RedisSettings, WorkerSettings  # noqa: E402

SETTINGS_MARKER = "<!-- settings tables: docs/hooks.py -->"
ROLES: list[tuple[str, type[BaseSettings], type[BaseSettings] | None]] = [
    ("Redis: every gateway and worker", RedisSettings, None),
    ("Gateway: `streampool gateway`", GatewaySettings, RedisSettings),
    ("Worker: `streampool worker` and `prepare-model`", WorkerSettings, RedisSettings),
    ("Client commands: `submit`, `follow`, `status`, `cancel`", ClientSettings, None),
]
"""Each table's heading, its settings class, and the class whose fields it leaves to another table."""
SEE_ALSO = {
    "Redis failover": "redis-failover.md",
    "Webhooks": "webhooks.md",
    "Tenants and their limits": "tenants.md",
    "Load tests without a GPU": "load-tests.md",
    "Agents and tool calling": "agents.md",
    "From vllm serve to streampool": "from-vllm-serve.md",
}
"""A description's "see <page title>" becomes a link to that page."""
BENCH_FILES = ("*.md", "*.png", "*.json")
"""What the site takes from bench/: its write-ups and what they show (the figures live there alone)."""


def _default(field: FieldInfo) -> str:
    value = field.default
    if value is None:
        return "(none)"
    if value in ("", []):
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        value = str(value).replace(str(Path.home()), "~", 1)
    return f"`{value}`"


def _description(field: FieldInfo) -> str:
    text = (field.description or "").replace("|", "\\|")
    for title, page in SEE_ALSO.items():
        text = text.replace(f"see {title}", f"see [{title}]({page})")
    return text


def settings_table(settings: type[BaseSettings], leave_out: type[BaseSettings] | None) -> list[str]:
    """One role's settings as a Markdown table: variable, flag (repeatable for a list), default, meaning."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    left_out = leave_out.model_fields if leave_out else {}
    for name, field in settings.model_fields.items():
        if name in left_out:
            continue
        flag = f"`--{name.replace('_', '-')}`"
        if get_origin(field.annotation) is list:  # as cli/main.py adds it: `append`
            flag += ", repeatable"
        rows.append(f"| `STREAMPOOL_{name.upper()}` | {flag} | {_default(field)} | {_description(field)} |")
    return rows


def settings_tables() -> str:
    lines: list[str] = []
    for heading, settings, leave_out in ROLES:
        lines += [f"## {heading}", "", *settings_table(settings, leave_out), ""]
    return "\n".join(lines)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """README.md is the home page (its links into docs/ made site-relative); bench/'s files are the
    benchmark's pages."""
    readme = (ROOT / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=readme.replace("](docs/", "](")))
    for pattern in BENCH_FILES:
        for path in sorted((ROOT / "bench").glob(pattern)):
            files.append(File.generated(config, f"bench/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **_: Any) -> str:
    """A page's links to ../bench/ (right where GitHub shows docs/) go to the site's bench/ pages;
    the configuration page gets its tables."""
    if page.file.src_uri == "configuration.md":
        if SETTINGS_MARKER not in markdown:
            raise ValueError(f"configuration.md lost its marker {SETTINGS_MARKER!r}")
        markdown = markdown.replace(SETTINGS_MARKER, settings_tables())
    if "/" not in page.file.src_uri:
        markdown = re.sub(r"\]\(\.\./bench/", "](bench/", markdown)
    return markdown
