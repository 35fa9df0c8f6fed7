"""The README says what the code does: its first commands are what CI runs, its option table is config.OPTIONS."""

from __future__ import annotations

import re
from pathlib import Path

from relayproxy.commands import config

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == "make test"


def test_configuration_table_lists_every_option_with_flag_environment_and_default():
    section = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else None
        if cells:
            rows[cells[0].strip("`")] = cells
    assert list(rows) == [o.name for o in config.OPTIONS]
    for option in config.OPTIONS:
        name, flag, env, default = rows[option.name][:4]
        assert flag == f"`--{option.name.replace('_', '-')}`"
        assert env == f"`RELAYPROXY_{option.name.upper()}`"
        assert default == ("" if option.default is None else f"`{option.default}`"), option.name


def test_documents_linked_from_the_readme_exist():
    for target in re.findall(r"\]\(((?:docs|docker)/[^)#]+)", README):
        assert (REPO / target).is_file(), target


def test_the_set_up_paragraph_names_every_package_the_makefile_installs():
    """Every Debian package `make setup` (system-packages) may install, read from the Makefile: the
    README's set-up paragraph (the one after the two commands) names each of them in backquotes."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nsystem-packages:", 1)[1].split("\n\n", 1)[0]
    installed = set(re.findall(r'missing="\$\$missing ([\w .-]+)"', recipe))
    installed |= set(re.findall(r'missing=" ([\w .-]+)"', recipe)) | set(re.findall(r'compose=" ([\w.-]+)"', recipe))
    packages = {p for group in installed for p in group.split()}
    assert {"mariadb-server", "python3", "python3-venv", "default-jre-headless", "mha4mysql-manager",
            "mha4mysql-node", "openssh-server", "docker-compose"} <= packages, packages
    paragraph = README.split("```\n\n", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z][\w.+-]*)`", paragraph))
    assert packages <= named, f"the README's set-up paragraph does not name {sorted(packages - named)}"
