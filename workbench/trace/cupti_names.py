"""The CUDA vocabulary every trace source shares: which API calls block, how copies are named,
and how CUPTI's raw API and kernel names are cleaned up.

No CUPTI import here: the Chrome and Nsight Systems readers use these names on machines
without cupti-python.
"""

from __future__ import annotations

import re

#: host calls that block the host thread until device work is done: kind "sync" in the Trace
SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cuStreamSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize",
    "cudaEventSynchronize", "cuEventSynchronize",
})

#: CUPTI's ActivityMemcpyKind names -> the Trace's ``copy_kind`` and Nsight Systems' memcpy label
COPY_KINDS = {"HTOD": ("H2D", "Host-to-Device"), "DTOH": ("D2H", "Device-to-Host"),
              "DTOD": ("D2D", "Device-to-Device"), "HTOH": ("H2H", "Host-to-Host"), "PTOP": ("P2P", "Peer-to-Peer")}
#: the numeric values of those ActivityMemcpyKind names (what Nsight Systems' SQLite export stores)
COPY_KIND_VALUES = {1: "HTOD", 2: "DTOH", 8: "DTOD", 9: "HTOH", 10: "PTOP"}

_VERSION_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def api_name(raw: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (Nsight Systems drops the suffixes)."""
    return _VERSION_SUFFIX.sub("", raw)


def kernel_base_name(name: str) -> str:
    """A kernel's function name without mangling and template arguments: ``_Z8rms_normPKfPfi``
    and ``rms_norm<256>`` both give ``rms_norm``; ``_ZN2ns4gemmE...`` gives ``gemm``."""
    if name.startswith("_Z"):
        s, i, parts = name, 2, []
        nested = s.startswith("_ZN")
        if nested:
            i = 3
            while i < len(s) and s[i] in "KVrL":
                i += 1
        while i < len(s) and s[i].isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            n = int(s[i:j])
            parts.append(s[j:j + n])
            i = j + n
            if not nested:
                break
        if parts:
            return parts[-1]
    return name.split("<", 1)[0].split("(", 1)[0].strip()
