"""simkit in a real Jupyter kernel: a notebook made here runs through nbconvert's ExecutePreprocessor.

It makes a tiny simkit result, displays it, calls ``result.plot(...)``, then draws the user's own
``plt.subplots()`` figure: simkit must leave the kernel's matplotlib backend (the inline one ipykernel
picks) alone, ``result.plot`` must show as an image once, and the user's figure must still render.

The kernel is the venv's ipykernel, started by this test over local Unix sockets (transport ``ipc``: no
TCP port, no network), with ``MPLBACKEND`` removed from its environment so it starts as Jupyter does.
"""

from __future__ import annotations

import os

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbconvert.preprocessors import ExecutePreprocessor

CELLS = {
    "make": """\
import torch
import simkit

torch.manual_seed(0)
a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
b = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.Tanh(), torch.nn.Linear(12, 4))
result = simkit.compare(a, b, torch.randn(64, 8), metrics=["linear_cka"], null=0, progress=False)""",
    "display": "result",
    "plot": 'result.plot("linear_cka")',
    "user": """\
import matplotlib.pyplot as plt

fig, ax = plt.subplots()
ax.plot([0, 1, 2], [0, 1, 4])""",
    "backend": "import matplotlib\nprint(matplotlib.get_backend())",
}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook of CELLS after a run in a fresh kernel: cell name → its outputs."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS.values()]
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    km = KernelManager(kernel_name="python3", transport="ipc",
                       ip=str(tmp_path_factory.mktemp("kernel-sockets") / "kernel"))
    km.start_kernel(env=env, cwd=str(tmp_path_factory.mktemp("notebook")))
    try:
        ExecutePreprocessor(timeout=600).preprocess(nb, {}, km=km)
    finally:
        km.shutdown_kernel(now=True)
    return {name: cell.outputs for name, cell in zip(CELLS, nb.cells, strict=True)}


def mime_types(outputs) -> list[str]:
    """Every MIME type of a cell's rich outputs (display data and the cell's value), one per output."""
    return [kind for out in outputs if out.output_type in ("display_data", "execute_result")
            for kind in out.get("data", {})]


def test_the_result_shows_its_report_inline(executed):
    assert "text/html" in mime_types(executed["display"])
    html = next(out.data["text/html"] for out in executed["display"] if "text/html" in out.get("data", {}))
    assert 'class="findings"' in html


def test_result_plot_shows_one_image_not_a_figure_repr(executed):
    kinds = mime_types(executed["plot"])
    assert kinds.count("image/png") == 1, kinds   # once: simkit's figure is never a pyplot figure
    texts = [out.data.get("text/plain", "") for out in executed["plot"] if out.output_type == "execute_result"]
    assert not any("<Figure size" in text and "image/png" not in kinds for text in texts)


def test_the_users_own_pyplot_figure_still_renders(executed):
    assert "image/png" in mime_types(executed["user"]), executed["user"]


def test_simkit_left_the_inline_backend_in_place(executed):
    printed = "".join(out.get("text", "") for out in executed["backend"] if out.output_type == "stream")
    assert "inline" in printed, printed
