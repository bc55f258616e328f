"""The example notebook runs headless (nbclient) with no error, and its displays are the interactive views."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "examples" / "bert-anatomy.ipynb"


def test_example_notebook_executes_and_displays_interactive_views(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "0")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # the notebook's own assertions (exact counts) fail the run with CellExecutionError
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
                            ).execute()
    html_outputs = [output["data"]["text/html"] for cell in notebook.cells if cell.cell_type == "code"
                    for output in cell.outputs if output.get("output_type") == "execute_result"
                    and "text/html" in output.get("data", {})]
    assert len(html_outputs) == 4  # BertModel, the sentiment head, the LoRA plan, the fine-tune's memory
    for html in html_outputs:
        assert "if(!window.Plotly)" in html and "Plotly.newPlot(" in html
        assert "cdn." not in html.split("if(!window.Plotly)")[0]  # no CDN: plotly.js travels in the output
    assert 'data-total="109482240"' in html_outputs[0]
    assert 'data-trainable="294912"' in html_outputs[2]
    texts = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                    for output in cell.outputs)
    assert "+32,058 parameters against BertModel" in texts
    assert "trainable 294,912 of 109,809,210 (0.27%)" in texts
