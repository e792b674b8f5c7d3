"""What the home seed saves each sandbox: matplotlib's first import with the font list built in.

Runs an image the tool built with matplotlib as the platform runs it (read-only root, uid
65532, a tmpfs /tmp) and times, in fresh processes interleaved, `import matplotlib.pyplot` in a
home seeded from /opt/sandbox/home (what the server gives every sandbox at start) and in an
empty one (what the first process of every sandbox paid before: it builds the font list), and
the font list alone (read from the seeded cache, or built; its module imported untimed).
Prints the medians and the ratios.

    .venv/bin/python benchmarks/first_use.py IMAGE [--runs 7]

Needs the engine and an image built with matplotlib (tests/integration/test_first_use.py builds
one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

DOCKER = "/usr/bin/docker"
# name -> (set-up, what is timed); the font list is read from the cache when the home holds it
TIMED = {
    "import": ("pass", "import matplotlib.pyplot"),
    "font list": (
        "import matplotlib.font_manager as fm",
        "fm._load_fontmanager(try_read_cache=%s)",
    ),
}
# One container: each run starts a fresh python3 in a home made for it, seeded or empty.
SCRIPT = """
import json, os, shutil, subprocess, sys, time
runs, timed = int(sys.argv[1]), json.loads(sys.argv[2])
found = {}
for _ in range(runs):
    for seeded in (True, False):
        for name, (setup, code) in timed.items():
            shutil.rmtree("/tmp/home", ignore_errors=True)
            if seeded:
                shutil.copytree("/opt/sandbox/home", "/tmp/home")
            else:
                os.makedirs("/tmp/home")
            code = code % seeded if "%s" in code else code
            timing = f"{setup}; import time; t = time.perf_counter(); {code}"
            timing += "; print(time.perf_counter() - t)"
            out = subprocess.run([sys.executable, "-c", timing], capture_output=True, text=True)
            key = f"{name} {'seeded' if seeded else 'empty'}"
            found.setdefault(key, []).append(float(out.stdout))
print(json.dumps(found))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    result = subprocess.run(
        [DOCKER, "run", "--rm", "--read-only", "--user", "65532:65532", "--cap-drop", "ALL",
         "--network", "none", "--tmpfs", "/tmp:rw,mode=1777", "--entrypoint", "python3",
         args.image, "-c", SCRIPT, str(args.runs), json.dumps(TIMED)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = json.loads(result.stdout)
    medians = {name: statistics.median(values) for name, values in found.items()}
    for name, value in medians.items():
        print(f"{name:22} {value:8.4f} s (median of {args.runs})")
    for name in TIMED:
        empty, seeded = medians[f"{name} empty"], medians[f"{name} seeded"]
        print(f"{name}: empty home / seeded home = {empty / seeded:.2f}x")


if __name__ == "__main__":
    main()
