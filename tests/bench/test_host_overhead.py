"""bench.host_overhead: the parts add up, the decoder's functions are restored afterwards."""
import json

import specfold_compile.decoding.decoder as decoder
from bench import host_overhead


def test_host_overhead_rows(tmp_path, capsys):
    before = decoder._verify, decoder.build_drafts
    out = tmp_path / "host.json"
    assert host_overhead.main(["--tasks", "math", "--limit", "2", "--out", str(out)]) == 0
    assert (decoder._verify, decoder.build_drafts) == before
    (row,) = json.loads(out.read_text())["rows"]
    assert row["task"] == "math" and row["calls"] > 0
    parts = [row[f"{k}_ms_per_call"] for k in ("verify_host", "drafts", "loop")]
    assert all(p > 0 for p in parts) and row["forward_ms_per_call"] > 0
    assert abs(sum(parts) - row["host_ms_per_call"]) < 1e-9
    assert 0 < row["masked_share_multi_branch"] < 1
    assert '"task": "math"' in capsys.readouterr().out
