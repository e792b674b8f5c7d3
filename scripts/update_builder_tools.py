"""Pin the newest pip wheel on the index into builder/data/builder-tools.toml."""

from __future__ import annotations

from pathlib import Path

from packaging.utils import parse_wheel_filename

from builder.resolve.index import DEFAULT_INDEX, index_files

TOOLS = Path(__file__).resolve().parent.parent / "builder" / "data" / "builder-tools.toml"


def main() -> None:
    wheels = [f for f in index_files([DEFAULT_INDEX], "pip") if f.filename.endswith(".whl")]
    newest = max(wheels, key=lambda f: parse_wheel_filename(f.filename)[1])
    version = parse_wheel_filename(newest.filename)[1]
    header = "".join(line for line in TOOLS.read_text().splitlines(True) if line.startswith("#"))
    TOOLS.write_text(
        f'{header}[pip]\nversion = "{version}"\nfilename = "{newest.filename}"\n'
        f'sha256 = "{newest.sha256}"\n'
    )
    print(f"pip {version} {newest.sha256}")


if __name__ == "__main__":
    main()
