"""``dump_dir``: every compiled graph in its own folder, ``graph_NN/``, holding the graph as Dynamo gave it
(``00_input.py``), after every rewrite in order (``01_insert_gates.py``, ...), the graph that runs
(``NN_final.py``, after the last pass) and the region report (``regions.txt``). Nodes the passes
inserted are listed with their region and role at the end of each file."""

from __future__ import annotations

from pathlib import Path

from torch.fx import GraphModule

from .logs import annotated_code

REPORT = "regions.txt"


class GraphDumps:
    """The dump folder of one graph (nothing is written without a ``dump_dir``)."""

    def __init__(self, dump_dir: str | None, title: str = "") -> None:
        self.dir: Path | None = None
        self.title = title
        if dump_dir:
            root = Path(dump_dir)
            root.mkdir(parents=True, exist_ok=True)
            number = sum(1 for p in root.glob("graph_*") if p.is_dir())
            while (root / f"graph_{number:02d}").exists():
                number += 1
            self.dir = root / f"graph_{number:02d}"
            self.dir.mkdir()

    def graph(self, index: int, step: str, gm: GraphModule, final: bool = False) -> None:
        """The graph after step ``index`` (0: ``input``); ``final``: the last step, named ``final``."""
        if self.dir is None:
            return
        name = "final" if final else step
        header = f"# {self.title}: step {index:02d}, " + (f"after {step}, the graph that runs" if final else
                                                         "as Dynamo traced it" if index == 0 else f"after {step}")
        (self.dir / f"{index:02d}_{name}.py").write_text(header + "\n" + annotated_code(gm))

    def report(self, text: str) -> None:
        if self.dir is not None:
            (self.dir / REPORT).write_text(text)
