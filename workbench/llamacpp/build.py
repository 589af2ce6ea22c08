"""Build llama.cpp's shared libraries (``libllama.so``, ``libggml*.so``) once and cache them.

The source is the llama.cpp tree the project measures against (``shared/peer/llama.cpp`` beside
the checkout, or ``.peer/llama.cpp`` inside it on the GPU machine). A build is keyed by a hash of
that tree and the flavour (``cpu`` or ``cuda-sm90``), so a changed tree rebuilds and an unchanged
one is found again: ``~/.cache/workbench/llama.cpp/<tree hash>-<flavour>/lib``.

Command line (what CI and the GPU script call)::

    python -m workbench.llamacpp.build [--cuda-arch 90] [--bench] [--src DIR] [--jobs N]   # prints the lib folder

``--bench`` also builds ``llama-bench`` (in ``<build>/build/bin``, see :func:`llama_bench`), the
tool whose timings the backend's are checked against.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: Environment variable naming a llama.cpp source tree (overrides the search below).
SRC_ENV = "WORKBENCH_LLAMACPP_SRC"
#: Where builds are cached (``$WORKBENCH_CACHE`` or ``~/.cache/workbench``) / llama.cpp.
CACHE_ENV = "WORKBENCH_CACHE"

REPO_ROOT = Path(__file__).resolve().parents[2]


class BuildError(RuntimeError):
    """llama.cpp could not be found or built; the message names the fix."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "workbench") / "llama.cpp"


def find_source(src: str | Path | None = None) -> Path:
    """The llama.cpp source tree: ``src``, ``$WORKBENCH_LLAMACPP_SRC``, ``.peer/llama.cpp`` in the
    checkout, or ``shared/peer/llama.cpp`` in the checkout's parent (where CI and the worktrees
    see it)."""
    candidates = [Path(src)] if src else []
    if os.environ.get(SRC_ENV):
        candidates.append(Path(os.environ[SRC_ENV]))
    candidates += [REPO_ROOT / ".peer" / "llama.cpp", REPO_ROOT.parent / "shared" / "peer" / "llama.cpp"]
    for c in candidates:
        if (c / "CMakeLists.txt").is_file() and (c / "include" / "llama.h").is_file():
            return c.resolve()
    raise BuildError("no llama.cpp source tree found (looked in "
                     + ", ".join(str(c) for c in candidates)
                     + f"); set {SRC_ENV} to a llama.cpp checkout")


def tree_hash(src: Path) -> str:
    """A hash of every file's path and bytes under the parts of the tree the libraries use."""
    h = hashlib.sha256()
    for sub in ("CMakeLists.txt", "cmake", "ggml", "include", "src"):
        root = src / sub
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            h.update(str(f.relative_to(src)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def build_dir(src: Path, flavour: str) -> Path:
    return cache_root() / f"{tree_hash(src)}-{flavour}"


def libs_ok(lib: Path) -> bool:
    return (lib / "libllama.so").is_file() and any(lib.glob("libggml-base.so*"))


def llama_bench(lib: str | Path) -> Path | None:
    """The ``llama-bench`` built with the libraries in ``lib`` (beside them, as in a CMake
    ``bin`` folder, or in this module's ``build/bin``); None if it was not built."""
    for exe in (Path(lib) / "llama-bench", Path(lib).parent / "build" / "bin" / "llama-bench"):
        if exe.is_file():
            return exe
    return None


def build(src: str | Path | None = None, cuda_arch: str | None = None, jobs: int | None = None,
          bench: bool = False, log=sys.stderr) -> Path:
    """Configure and build llama.cpp (CPU, or CUDA for ``cuda_arch``; ``bench``: llama-bench
    too); return the folder holding ``libllama.so`` and ``libggml*.so``. A finished build is
    reused; a cut one resumes."""
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not installed; install it (apt-get install cmake / pip install cmake)")
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    if generator != "Ninja" and shutil.which("make") is None:
        raise BuildError("neither ninja nor make is installed; install one (apt-get install ninja-build)")
    source = find_source(src)
    flavour = f"cuda-sm{cuda_arch}" if cuda_arch else "cpu"
    out = build_dir(source, flavour)
    lib = out / "lib"
    if libs_ok(lib) and (not bench or llama_bench(lib)):
        return lib
    work = out / "build"
    work.mkdir(parents=True, exist_ok=True)
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", f"-DLLAMA_BUILD_TOOLS={'ON' if bench else 'OFF'}",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
            f"-DLLAMA_BUILD_COMMON={'ON' if bench else 'OFF'}",
            "-DLLAMA_OPENSSL=OFF", "-DGGML_CCACHE=OFF"]
    if cuda_arch:
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", "-DGGML_CUDA_NCCL=OFF"]
    logfile = out / "build.log"
    t0 = time.time()
    with open(logfile, "a") as fh:
        if not (work / "CMakeCache.txt").is_file() or (bench and "LLAMA_BUILD_TOOLS:BOOL=OFF" in _cache(work)):
            print(f"[llamacpp build] configuring {source} ({flavour}) in {work}", file=log)
            _run(["cmake", "-S", str(source), "-B", str(work), "-G", generator, *args], fh, logfile)
        print(f"[llamacpp build] building libllama ({flavour}); log: {logfile}", file=log)
        targets = ["llama"] + (["llama-bench"] if bench else [])
        _run(["cmake", "--build", str(work), "--target", *targets, "-j", str(jobs or os.cpu_count() or 2)],
             fh, logfile)
    lib.mkdir(exist_ok=True)
    for so in (work / "bin").glob("lib*.so*"):  # the real files and their soname links
        (lib / so.name).unlink(missing_ok=True)  # a rebuild (e.g. --bench later): a link is not overwritten
        shutil.copy2(so, lib / so.name, follow_symlinks=False)
    if not libs_ok(lib):
        raise BuildError(f"the build finished but {lib} lacks libllama.so / libggml-base.so; see {logfile}")
    (out / "source").write_text(f"{source}\n")
    print(f"[llamacpp build] done in {time.time() - t0:.0f} s: {lib}", file=log)
    return lib


def _cache(work: Path) -> str:
    p = work / "CMakeCache.txt"
    return p.read_text(errors="replace") if p.is_file() else ""


def _run(cmd: list[str], fh, logfile: Path) -> None:
    fh.write("$ " + " ".join(cmd) + "\n")
    fh.flush()
    rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(f"{cmd[0]} {cmd[1]} failed (exit {rc}); last lines of {logfile}:\n" + "\n".join(tail))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.llamacpp.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--src", help=f"llama.cpp source tree (default: ${SRC_ENV} or the peer tree)")
    p.add_argument("--cuda-arch", help="build the CUDA backend for this compute capability (e.g. 90)")
    p.add_argument("--bench", action="store_true", help="build llama-bench too")
    p.add_argument("--jobs", type=int)
    args = p.parse_args(argv)
    try:
        print(build(args.src, args.cuda_arch, args.jobs, bench=args.bench))
    except BuildError as e:
        print(f"llama.cpp build: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
