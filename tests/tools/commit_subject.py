"""pre-commit's commit-msg hook: a commit subject of at most 72 characters, and a blank line before the
body (the why), so `git log --oneline` stays readable."""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 72


def problems(message: str) -> list[str]:
    """What is wrong with a commit message, one line each (none: it is fine)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    if not lines or not lines[0].strip():
        return ["the commit message has no subject line"]
    found = []
    if len(lines[0]) > LIMIT:
        found.append(f"the subject is {len(lines[0])} characters; at most {LIMIT}")
    if len(lines) > 1 and lines[1].strip():
        found.append("the subject needs a blank line after it, before the body")
    return found


if __name__ == "__main__":
    wrong = problems(Path(sys.argv[1]).read_text())
    for line in wrong:
        print(f"{sys.argv[1]}: {line}", file=sys.stderr)
    sys.exit(1 if wrong else 0)
