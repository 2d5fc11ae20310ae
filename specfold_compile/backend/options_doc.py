"""docs/options.md, generated from the settings dataclasses:
``python -m specfold_compile.backend.options_doc > docs/options.md``."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .settings import FLAT_TUNING, SpecFoldSettings, Tuning

HEADER = """# Options

Generated from `specfold_compile/backend/settings.py` by
`python -m specfold_compile.backend.options_doc > docs/options.md`; do not edit by hand.

`torch.compile(model, backend="specfold", options={...})` or `SpecFoldBackend(**options)`. The
performance knobs go in `options["tuning"]` (a `Tuning`, or a dict of its fields), e.g.
`SpecFoldBackend(tau=0.1, tuning=Tuning(dense_fraction=0.3))`; {flat} are accepted as flat options too.
Tuning's defaults are the H200 device profile's (`specfold_compile/ops/device_profile.py`;
`Tuning.from_profile(profile)` for another).
"""


def _default(f: dataclasses.Field) -> str:
    if f.metadata.get("shown"):
        return f.metadata["shown"]
    value = f.default
    return repr(value) if not isinstance(value, float) else f"{value:g}"


def _type(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _section(cls, title: str) -> list[str]:
    lines = [f"## {title}", "", (cls.__doc__ or "").split("\n\n")[0].replace("\n    ", " ").strip(), ""]
    group = None
    for f in dataclasses.fields(cls):
        if f.metadata["group"] != group:
            group = f.metadata["group"]
            lines += ([""] if lines[-1] else []) + [f"### {group.capitalize()}", ""]
        lines.append(f"- **`{f.name}`** (`{_type(f)}`, default `{_default(f)}`): {f.metadata['doc']}")
    return lines + [""]


def markdown() -> str:
    flat = ", ".join(f"`{name}`" for name in FLAT_TUNING)
    lines = [HEADER.replace("{flat}", flat)]
    lines += _section(SpecFoldSettings, "SpecFoldSettings")
    lines += _section(Tuning, "Tuning")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m specfold_compile.backend.options_doc",
                            description="Print docs/options.md (Markdown) from the settings dataclasses.").parse_args(argv)
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
