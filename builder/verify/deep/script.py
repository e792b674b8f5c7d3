"""The in-image side of deep imports: the scripts that list a distribution's modules and import
each in worker interpreters, as text run by the image's own `python3 -c`.

Apart from builder.verify.deep.imports (the host's side) because they are not the host's
Python: they run inside the image, hardened through the sandbox's /execute and permissive by
the engine.
"""

from __future__ import annotations

# One worker: reads module names from the fd in argv[1] (never stdin, which a module may read),
# imports each, and writes one JSON line per module on its own copy of stdout (what modules
# print goes to stderr, which the parent discards).
WORKER = r"""
import importlib, json, os, sys, time, traceback
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
feed = os.fdopen(int(sys.argv[1]))
sys.argv = ["-c"]  # as `python3 -c` has it: a module parsing argv at import sees no fd number
for line in feed:
    name, started = line.strip(), time.monotonic()
    try:
        importlib.import_module(name)
        result = {"ok": True}
    except BaseException as error:  # SystemExit too: the module's failure, not the worker's
        text = traceback.format_exception_only(error)[-1].strip()
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        result = {"ok": False, "error": text[:400], "missing": missing}
    result.update(module=name, seconds=round(time.monotonic() - started, 3))
    out.write(json.dumps(result) + "\n")
    out.flush()
"""

# The parent: argv[1] is a JSON request {"distributions": [...]} (list their modules, less
# those matching "skip") or {"modules": [...]}, with "budget" seconds and "workers". Writes JSON
# lines: one per distribution listed, one per module imported, then {"done": ...}. A module
# whose import has not ended after "module_timeout" seconds is given up (its worker killed).
DEEP = r"""
import fnmatch, importlib.machinery, json, os, queue, select, subprocess, sys, threading, time
from importlib import metadata
request = json.loads(sys.argv[1])
WORKER = sys.argv[2]
SKIP = {"test", "tests", "testing", "examples", "example", "docs", "doc", "benchmarks",
        "vendor", "_vendor", "vendored", "_vendored", "__main__", "conftest"}
# a bare .so is as often a plain shared library (lightgbm's lib_lightgbm.so) as a module: the
# tagged suffixes (.cpython-313-x86_64-linux-gnu.so, .abi3.so) name the modules
TAGGED = [suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix != ".so"]
SUFFIXES = sorted(TAGGED + [".py"], key=len, reverse=True)
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
lock = threading.Lock()

def emit(value):
    with lock:
        out.write(json.dumps(value) + "\n")
        out.flush()

def module_name(parts):
    stem = next((parts[-1][: -len(s)] for s in SUFFIXES if parts[-1].endswith(s)), None)
    if stem is None:
        return None
    names = list(parts[:-1]) + ([] if stem == "__init__" else [stem])
    if not names or not all(n.isidentifier() for n in names):
        return None
    if any(n in SKIP or n.startswith("test_") for n in names):
        return None
    return ".".join(names)

def listed(name):
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    found = {module_name(f.parts) for f in dist.files or [] if f.parts and f.parts[0] != ".."}
    return sorted(m for m in found if m)

def wanted():
    if "modules" in request:
        return list(request["modules"])
    todo = []
    for name in request["distributions"]:
        modules = listed(name)
        skip = request.get("skip", [])
        kept = [m for m in modules or [] if not any(fnmatch.fnmatchcase(m, p) for p in skip)]
        emit({"distribution": name, "modules": kept, "absent": modules is None,
              "skipped": len(modules or []) - len(kept)})
        todo += [m for m in kept if m not in todo]
    return todo

# Work is handed out a package's modules at a time (in chunks of at most CHUNK): a package's
# __init__ (often most of its cost: lightgbm's loads sklearn and pandas) is paid by one worker
# rather than by each, and heavy packages still spread over the workers.
CHUNK = 200
todo, deadline, running = queue.Queue(), time.monotonic() + request["budget"], []
groups = {}
for module in wanted():
    groups.setdefault(module.split(".")[0], []).append(module)
for modules in groups.values():
    for start in range(0, len(modules), CHUNK):
        todo.put(modules[start:start + CHUNK])

def start():
    read, write = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(read)], pass_fds=[read],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    os.close(read)
    with lock:
        running.append(worker)
    return worker, os.fdopen(write, "w")

def work():
    worker = feed = None
    names = []
    while True:
        if not names:
            try:
                names = todo.get_nowait()
            except queue.Empty:
                break
        name = names.pop(0)
        if time.monotonic() > deadline:
            emit({"module": name, "unreached": True})
            continue
        if worker is None:
            worker, feed = start()
        try:
            feed.write(name + "\n")
            feed.flush()
        except OSError:
            pass
        wait = max(0.0, min(request["module_timeout"], deadline - time.monotonic()))
        line = worker.stdout.readline() if select.select([worker.stdout], [], [], wait)[0] else None
        if line:
            emit(json.loads(line))
            continue
        if line is None:  # still importing: this module alone is given up, in a new worker
            worker.kill()
        code = worker.wait()
        if time.monotonic() > deadline:
            emit({"module": name, "unreached": True})
        elif line is None:
            error = f"the import did not end within {request['module_timeout']:g} s"
            emit({"module": name, "ok": False, "error": error})
        else:
            emit({"module": name, "ok": False, "error": f"the interpreter died (exit {code})"})
        worker = feed = None
    if feed is not None:
        feed.close()
        worker.wait()

began = time.monotonic()
threads = [threading.Thread(target=work, daemon=True) for _ in range(request["workers"])]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))
cut = any(thread.is_alive() for thread in threads)
with lock:
    for worker in running:
        worker.kill()
for thread in threads:
    thread.join()
emit({"done": {"seconds": round(time.monotonic() - began, 2), "cut": cut}})
"""
