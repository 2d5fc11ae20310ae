"""bench.packed_rows on the CPU: a row per model and row count, timed over the packed rows it names, and
the benchmark page's table of them."""
import json

from bench import packed_rows
from bench.report_batched import render_packed_rows


def test_packed_rows_times_every_count_and_renders(tmp_path):
    out = tmp_path / "packed.json"
    assert packed_rows.main(["--device", "cpu", "--models", "tiny-fast-dllm-v2,tiny-nld", "--rows", "8,32",
                             "--replays", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["suite"] == "packed_rows" and "torch" in data["versions"]
    assert [(r["model"], r["rows"]) for r in data["rows"]] == [
        (m, n) for m in ("tiny-fast-dllm-v2", "tiny-nld") for n in (8, 32)]
    for r in data["rows"]:
        assert r["us"] > 0 and r["us_per_row"] == r["us"] / r["rows"]
    table = render_packed_rows(data)
    assert table[0] == "| packed rows | tiny-fast-dllm-v2 (us) | tiny-nld (us) |"
    assert [line.split(" | ")[0] for line in table[2:4]] == ["| 8", "| 32"]
