"""The README's Python example runs as written (in the repository root)."""

from __future__ import annotations

import os
import re

from conftest import REPO


def test_readme_python_example(tmp_path, capsys):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = [b for b in blocks if b.startswith("import graphopt, numpy as np")]
    assert len(example) == 1, "the README's Python example moved"
    code = example[0].replace('"bert_tiny.fp16.onnx"', repr(str(tmp_path / "bert_tiny.fp16.onnx")))
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out.split()
    assert out[3] == "True" and int(out[4]) > 1
    assert (tmp_path / "bert_tiny.fp16.onnx").stat().st_size > 0
