"""The commit-msg hook of .pre-commit-config.yaml (tests/tools/commit_subject.py)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.helpers import REPO
from tests.tools.commit_subject import LIMIT, problems


def test_a_subject_within_the_limit_with_a_body_after_a_blank_line_passes():
    assert problems("Batcher: keep the queue bounded\n\nWhy: a burst grew it without end.\n") == []
    assert problems("x" * LIMIT) == []


def test_a_long_subject_or_a_body_without_a_blank_line_fails():
    assert problems("x" * (LIMIT + 1)) == [f"the subject is {LIMIT + 1} characters; at most {LIMIT}"]
    assert problems("Subject\nbody straight after") == ["the subject needs a blank line after it, before the body"]
    assert problems("# only a comment\n") == ["the commit message has no subject line"]


def test_the_hook_exits_1_naming_the_file(tmp_path):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("y" * 80 + "\n")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "tools" / "commit_subject.py"), str(message)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.startswith(f"{message}: the subject is 80 characters")


def test_the_pre_commit_configuration_runs_the_project_s_own_checks():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert set(hooks) == {"ruff", "layers", "commit-subject"}
    assert "tests/test_layers.py" in hooks["layers"]["entry"]
    assert all(repo["repo"] == "local" for repo in config["repos"])  # nothing fetched from the network
