"""Run options checked before any work starts: ranges of the numeric options, output paths, and
the notices for options that have no effect under the chosen knobs or backend.

Pure functions over plain values, so the commands and the library entry point share them.
Errors are ``OptionError`` (a ValueError: the CLI prints one line and exits 2) and name the
option as the user typed it, its value and the allowed range; notices are returned as strings
for the caller to print, because a valid-but-pointless option is not a failure.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .strategy import Strategy

#: Most layers a ``--layers`` override may ask for; some families build per-layer tables eagerly.
MAX_LAYERS = 1_000_000
#: Largest KV length (``--context``) a shape may have (32-bit dimension indices).
MAX_CONTEXT = 2**31 - 1
MAX_SEED = 2**63 - 1
#: Figure formats that need a browser (kaleido drives Chrome/Chromium).
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


class OptionError(ValueError):
    """An option value the command cannot use; the message names the option and the fix."""


def check_range(flag: str, value: Any, lo: int, hi: int | None = None, hint: str = "") -> int:
    """``value`` as an int within [lo, hi], else an OptionError naming ``flag``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    if not ok:
        allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {_int_text(hi)}]"
        raise OptionError(f"{flag} {value!r} is out of range: must be {allowed}{'; ' + hint if hint else ''}")
    return value


def _int_text(n: int) -> str:
    """``2**63 - 1`` rather than 19 digits."""
    return f"2**{(n + 1).bit_length() - 1} - 1" if n >= 2**20 and (n + 1) & n == 0 else str(n)


def check_model_options(layers: int | None, context: int | None) -> None:
    """``--layers`` / ``--context`` before the config is loaded (a huge layer count would be
    expanded into per-layer tables while loading)."""
    if layers is not None:
        check_range("--layers", layers, 1, MAX_LAYERS)
    if context is not None:
        check_range("--context", context, 1, MAX_CONTEXT)


def check_steps(context: int, tokens: int, start_pos: int = 0, tokens_flag: str = "--tokens") -> None:
    """Decode steps ``start_pos .. start_pos + tokens - 1`` must lie inside the KV cache."""
    hint = f"the KV cache holds --context {context} positions (raise --context for more)"
    check_range(tokens_flag, tokens, 1, context, hint)
    check_range("--start-pos", start_pos, 0, context - 1, hint)
    if start_pos + tokens > context:
        raise OptionError(f"--start-pos {start_pos} + {tokens_flag} {tokens} = {start_pos + tokens} runs past "
                          f"--context {context}: lower them or raise --context")


def check_seed(seed: int) -> None:
    check_range("--seed", seed, 0, MAX_SEED, "the seed of the random weights and token ids")


def node_tokens_arg(text: str) -> int | None:
    """``--node-tokens``: None for ``all``, else a count >= 0; an OptionError otherwise."""
    t = str(text).strip().lower()
    if t == "all":
        return None
    try:
        n = int(t)
    except ValueError:
        raise OptionError(f"--node-tokens {text!r} is not a number of tokens: give N >= 0 (e.g. 2) or 'all'") from None
    return check_range("--node-tokens", n, 0, hint="0 = graph-level spans only, or 'all'")


# -- output paths --------------------------------------------------------------------------------
def check_output(flag: str, path: str | Path, suffixes: Iterable[str], why: str = "") -> Path:
    """An output path that can be written: a known suffix, an existing writable folder, not a
    folder itself, and the tools its format needs present. Checked before the work, so a typo
    does not cost a whole run; nothing is created."""
    path = Path(path)
    suffixes = tuple(suffixes)
    name = path.name.lower()
    suffix = next((x for x in sorted(suffixes, key=len, reverse=True) if name.endswith(x)), path.suffix.lower())
    if suffix not in suffixes:
        raise OptionError(f"{flag} {path}: unknown format {suffix or '(no suffix)'!r}{why}; use one of "
                          f"{', '.join(suffixes)}")
    if path.is_dir():
        raise OptionError(f"{flag} {path}: is a folder; give a file name ending in {suffix}")
    folder = path.parent
    if not folder.is_dir():
        raise OptionError(f"{flag} {path}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OptionError(f"{flag} {path}: not writable here (permissions of {folder if not path.exists() else path})")
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise OptionError(f"{flag} {path.name}: writing .parquet needs pyarrow (pip install pyarrow); "
                          "or use .csv / .json")
    if suffix in IMAGE_SUFFIXES:
        from .view.export import chromium_path

        if importlib.util.find_spec("kaleido") is None:
            raise OptionError(f"{flag} {path.name}: writing {suffix} needs kaleido (pip install 'kaleido>=1.0'); "
                              "or write .html")
        if chromium_path() is None:
            raise OptionError(f"{flag} {path.name}: writing {suffix} needs a Chrome/Chromium for kaleido and none "
                              "was found (apt-get install -y chromium, or set BROWSER_PATH); or write .html")
    return path


def run_labels(paths: Iterable[str | Path], flag: str = "--compare") -> list[str]:
    """Distinct labels for the runs of a comparison: the file name, or more of its path where
    two names clash; the same file given twice is an error (it would draw one run)."""
    paths = [Path(p) for p in paths]
    seen: dict[Path, Path] = {}
    for p in paths:
        key = p.resolve()
        if key in seen:
            raise OptionError(f"{flag} {p}: the same file as {seen[key]}; compare two or more different runs")
        seen[key] = p
    labels = [p.name for p in paths]
    depth = 1
    while len(set(labels)) < len(labels) and depth < 8:
        depth += 1
        labels = ["/".join(p.resolve().parts[-depth:]) for p in paths]
    return labels


# -- options that have no effect -----------------------------------------------------------------
def inert_options(opts: Mapping[str, Any], strategy: Strategy, backend: str | None = None) -> list[str]:
    """One notice per backend option that ``backend`` ignores under ``strategy``.

    ``opts``: the options as given (argparse names: ``node_tokens``, ``gpu``, ...; None or absent
    = not given); knob flags that have no effect are reported by ``strategy.knobs.inert_settings``.
    ``backend`` None: the command has no backend (``verify``), so nothing here applies.
    """
    if backend is None:
        return []
    given = {k: v for k, v in opts.items() if v is not None}
    notes: list[str] = []
    owners = {"kernels": "cuda", "node_tokens": "cuda", "gpu": "sim", "host_profile": "sim", "llamacpp": "llamacpp"}
    for key, owner in owners.items():
        if key in given and backend != owner:
            notes.append(f"--{key.replace('_', '-')} {given[key]} has no effect on the {backend} backend "
                         f"(it is a {owner} option)")
    if backend == "cuda" and "node_tokens" in given and not (strategy.graphs and given.get("trace")):
        notes.append(f"--node-tokens {given['node_tokens']} has no effect without --graphs and --trace "
                     "(it picks which graph replays are traced kernel by kernel)")
    if backend == "reference" and given.get("trace"):
        notes.append(f"--trace {given['trace']}: the reference backend records no timeline; the trace will be empty")
    return notes
