"""`--wheel-max` and the config's `wheel-max` (issue 59): a size as `--cache-max` takes it, the
flag over the config, a bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.config import RunSettings, load_config, merge
from builder.errors import UserError
from builder.oci.name import ImageRef

CONFIG = 'requirements = ["r.txt"]\nbase-repository = "x/y"\nplatform-version = "1"\n'


def _config(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "build-sandbox-image.toml"
    path.write_text(CONFIG + line)
    return path


@pytest.mark.parametrize(("flag", "wanted"), [(None, 500 * 10**6), (2 << 30, 2 << 30), (0, 0)])
def test_the_config_bounds_a_wheel_and_a_flag_wins(
    tmp_path: Path, flag: int | None, wanted: int
) -> None:
    config = load_config(_config(tmp_path, 'wheel-max = "500MB"\n'))
    assert config.wheel_max == 500 * 10**6
    asked = RunSettings((Path("r.txt"),), ImageRef.parse("x/y:1"), wheel_max=flag)
    assert merge(asked, config, output_given=False, base_given=False).wheel_max == wanted


def test_without_either_the_default_bound_holds(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, ""))
    asked = RunSettings((Path("r.txt"),), ImageRef.parse("x/y:1"))
    assert merge(asked, config, output_given=False, base_given=False).wheel_max is None


@pytest.mark.parametrize("value", ['"lots"', "-1", "true", '"-2GB"'])
def test_a_bad_wheel_max_is_named(tmp_path: Path, value: str) -> None:
    with pytest.raises(UserError, match="'wheel-max'"):
        load_config(_config(tmp_path, f"wheel-max = {value}\n"))
