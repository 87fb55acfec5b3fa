"""Every test checks something: its body, or a helper of the test tree that it calls (followed by name,
through helpers calling helpers), holds an `assert` or a checking call (`pytest.raises`,
`torch.testing.assert_close`, `torch.library.opcheck`, ...). A test that only runs code passes
whatever the code computes."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent
# Calls that fail the test by themselves when what they check does not hold.
CHECKING_CALLS = {"raises", "warns", "deprecated_call", "fail", "opcheck"}


def _called_names(node: ast.AST):
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute):
                yield n.func.attr
            elif isinstance(n.func, ast.Name):
                yield n.func.id


def _checks_itself(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node)) or any(
        name in CHECKING_CALLS or name.startswith("assert") for name in _called_names(node)
    )


def _tests_without_a_check() -> list[str]:
    functions: dict[str, list[ast.AST]] = {}
    tests = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, []).append(node)
                if path.name.startswith("test_") and node.name.startswith("test"):
                    tests.append((path, node))
    checking = {name for name, defs in functions.items() if any(_checks_itself(d) for d in defs)}
    grown = True
    while grown:
        callers = {
            name
            for name, defs in functions.items()
            if name not in checking and any(c in checking for d in defs for c in _called_names(d))
        }
        checking |= callers
        grown = bool(callers)
    return [
        f"{path.relative_to(TESTS.parent)}:{node.lineno} {node.name}"
        for path, node in tests
        if not (_checks_itself(node) or any(c in checking for c in _called_names(node)))
    ]


def test_every_test_checks_something():
    assert _tests_without_a_check() == []
