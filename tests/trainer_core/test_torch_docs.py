"""docs/pytorch.md's code: a name a block uses but neither defines nor imports (the user's model,
data, loss) is named in a comment of that block as the user's own code, so that nobody looks for
``make_model()`` in the library."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def undefined(code: str) -> set[str]:
    """The names ``code`` loads that it does not bind (assignments, imports, loop targets, ...)."""
    tree = ast.parse(code)
    bound: set[str] = set(dir(builtins))
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound


def test_every_name_a_code_block_leaves_to_the_user_is_said_to_be_theirs() -> None:
    blocks = BLOCK.findall(DOC.read_text())
    assert len(blocks) >= 4
    for code in blocks:
        comments = " ".join(line.split("#", 1)[1] for line in code.splitlines() if "#" in line)
        said = set(re.findall(r"[A-Za-z_]\w*", comments)) if "your own" in comments else set()
        assert undefined(code) <= said, (undefined(code) - said, code)
