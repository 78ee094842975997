"""Every notebook: outputs stripped in git, a typed and commented `parameters` first code
cell that papermill's --help-notebook fully understands, kernel metadata present."""

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_stripped(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_cell_is_typed_commented_and_inferred(path):
    import nbformat
    import papermill as pm

    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell is parameters"
    names = []
    for node in ast.parse(code[0].source).body:
        assert isinstance(node, ast.AnnAssign), f"untyped parameter line: {ast.unparse(node)}"
        names.append(node.target.id)
    for line in code[0].source.splitlines():
        if line.strip():
            assert "  # " in line, f"parameter without a comment: {line}"
    inferred = pm.inspect_notebook(str(path))  # what `papermill --help-notebook` lists
    assert set(names) == set(inferred), "papermill --help-notebook must list every parameter"
    for p in inferred.values():
        assert p["help"] and p["inferred_type_name"] != "None"
