"""The level-of-detail arrays of a timeline, packed small for HTML.

``layout.meta.workbench.lod`` holds every event of a timeline (``workbench.view.timeline``):
start and end (f8 µs), row (f4), four customdata columns (i4) and a label code (i4), 40 bytes an
event, 53 in base64. In an exported HTML file each array is stored instead as integers of the
narrowest width that holds them (times as ns; starts, tokens and correlation ids as differences
to the previous event, which are small because each class is sorted by start), byte-shuffled
(the low bytes of all values, then the high bytes: what deflate compresses well) and deflated.
``UNPACK_JS`` restores the arrays in the browser with the built-in ``DecompressionStream``,
bit-exact: the µs times are computed as ``ns / 1000`` in float64 on both sides.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np

LEVEL = 6
_INT_CODES = {np.dtype(np.int8): "i1", np.dtype(np.int16): "i2", np.dtype(np.int32): "i4"}


def _narrow(a: np.ndarray) -> np.ndarray | None:
    """``a`` (integers) in the narrowest signed type that holds it, None beyond int32."""
    if len(a) == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    return None


def _blob(a: np.ndarray, delta: bool) -> dict[str, Any]:
    """One packed array: {dtype, delta, n, z (base64 of the deflated, byte-shuffled values)}."""
    width = a.dtype.itemsize
    raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1, width).T.tobytes() if width > 1 else a.tobytes()
    code = _INT_CODES.get(a.dtype, "f8")
    return {"dtype": code, "delta": delta, "n": int(len(a)),
            "z": base64.b64encode(zlib.compress(raw, LEVEL)).decode("ascii")}


def _ints(values: np.ndarray, delta: bool) -> dict[str, Any]:
    v = values.astype(np.int64)
    if delta:
        d = _narrow(np.diff(v, prepend=np.int64(0)))
        if d is not None:
            return _blob(d, True)
    n = _narrow(v)
    return _blob(n, False) if n is not None else _blob(v.astype(np.float64), False)


def _times_ns(x_us: np.ndarray) -> np.ndarray | None:
    """The ns integers behind µs times computed as ns / 1000 (None if they are not such)."""
    ns = np.rint(np.asarray(x_us, dtype=np.float64) * 1e3)
    if not np.isfinite(ns).all() or np.abs(ns).max(initial=0) >= 2**53 or not (ns / 1e3 == x_us).all():
        return None
    return ns.astype(np.int64)


def pack_class(c: dict[str, Any]) -> dict[str, Any]:
    """One colour class of ``lod.classes`` with its arrays packed (other keys unchanged)."""
    x0, x1 = np.asarray(c["x0"], dtype=np.float64), np.asarray(c["x1"], dtype=np.float64)
    cd = np.asarray(c["cd"]).reshape(-1, 4)
    y = np.asarray(c["y"], dtype=np.float64)
    out = {k: v for k, v in c.items() if k not in ("x0", "x1", "y", "cd", "label")}
    s_ns, e_ns = _times_ns(x0), _times_ns(x1)
    if s_ns is not None and e_ns is not None:
        out["x0"], out["dur"] = _ints(s_ns, True), _ints(e_ns - s_ns, False)
    else:
        out["x0"], out["x1"] = _blob(x0, False), _blob(x1, False)
    out["y"] = _ints(y, False) if (y == np.rint(y)).all() else _blob(y, False)
    out["cd"] = [_ints(cd[:, k], k >= 2) for k in range(4)]
    out["label"] = _ints(np.asarray(c["label"]), False)
    return out


def pack_lod(lod: dict[str, Any]) -> dict[str, Any]:
    """``lod`` with every class packed and ``packed: true`` (what ``UNPACK_JS`` expects)."""
    return {**lod, "packed": True, "classes": {k: pack_class(c) for k, c in lod["classes"].items()}}


#: ``unpackLod(lod)``: a Promise of the classes as ``LOD_JS`` uses them (x0, x1 Float64Array,
#: y Float32Array, cd Int32Array of 4 columns per event, label Int32Array)
UNPACK_JS = r"""
  var TYPED = {i1: Int8Array, i2: Int16Array, i4: Int32Array, f8: Float64Array};
  function inflate(b64) {
    var bin = atob(b64), u8 = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { u8[i] = bin.charCodeAt(i); }
    var stream = new Blob([u8]).stream().pipeThrough(new DecompressionStream('deflate'));
    return new Response(stream).arrayBuffer();
  }
  function unpackArray(p) {       // -> Float64Array of the values (prefix sums where delta)
    return inflate(p.z).then(function (buf) {
      var T = TYPED[p.dtype], w = T.BYTES_PER_ELEMENT, n = p.n, src = new Uint8Array(buf);
      var bytes = new Uint8Array(n * w);
      for (var b = 0; b < w; b++) { for (var i = 0; i < n; i++) { bytes[i * w + b] = src[b * n + i]; } }
      var v = new T(bytes.buffer), out = new Float64Array(n), acc = 0;
      for (var k = 0; k < n; k++) { if (p.delta) { acc += v[k]; out[k] = acc; } else { out[k] = v[k]; } }
      return out;
    });
  }
  function unpackClass(c) {
    var parts = [unpackArray(c.x0), c.dur ? unpackArray(c.dur) : unpackArray(c.x1), unpackArray(c.y),
                 unpackArray(c.label)].concat(c.cd.map(unpackArray));
    return Promise.all(parts).then(function (a) {
      var n = a[0].length, x0 = new Float64Array(n), x1 = new Float64Array(n), cd = new Int32Array(4 * n);
      for (var i = 0; i < n; i++) {
        if (c.dur) { x0[i] = a[0][i] / 1e3; x1[i] = (a[0][i] + a[1][i]) / 1e3; }
        else { x0[i] = a[0][i]; x1[i] = a[1][i]; }
        for (var k = 0; k < 4; k++) { cd[4 * i + k] = a[4 + k][i]; }
      }
      var out = {};
      Object.keys(c).forEach(function (key) { out[key] = c[key]; });
      out.x0 = x0; out.x1 = x1; out.y = new Float32Array(a[2]); out.label = new Int32Array(a[3]); out.cd = cd;
      return out;
    });
  }
  function unpackLod(lod) {
    var names = Object.keys(lod.classes);
    return Promise.all(names.map(function (k) { return unpackClass(lod.classes[k]); })).then(function (cs) {
      var out = {};
      names.forEach(function (k, i) { out[k] = cs[i]; });
      return out;
    });
  }
"""
