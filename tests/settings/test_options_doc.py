"""docs/options.md is what the generator writes from the settings dataclasses."""

import dataclasses
from pathlib import Path

from specfold_compile.backend.options_doc import markdown
from specfold_compile.backend.settings import SpecFoldSettings, Tuning

ROOT = Path(__file__).resolve().parents[2]


def test_committed_options_md_matches_the_generator():
    committed = (ROOT / "docs" / "options.md").read_text()
    assert committed == markdown(), ("docs/options.md is stale: run "
                                     "`python -m specfold_compile.backend.options_doc > docs/options.md`")


def test_every_field_is_documented():
    text = markdown()
    for cls in (SpecFoldSettings, Tuning):
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"] and f"**`{f.name}`**" in text, f.name
