"""Numba CUDA twins of the elementwise and normalisation kernels (``--kernels numba``).

Same contract as the CUDA C kernels in ``elementwise.cu`` and ``norm.cu``: every view arrives
as a 4-D array over the view's own bytes (left-padded shape, byte strides, stride 0 on broadcast
axes), a flat element index is unravelled over each array's own shape (the destination may be
a reshaped or copy-eliminated view), and rows are the first three axes with the row on the
last. The executor uses these kernels for views of float32 data; other dtypes (and PDL, which
Numba cannot launch) stay on the CUDA C kernels.

Under ``NUMBA_ENABLE_CUDASIM=1`` these run on the CPU (Numba's CUDA simulator), which is how
CI tests them against the NumPy reference ops.
"""

from __future__ import annotations

import math

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30 registers an overload of np.row_stack (gone in NumPy 2.5)
    np.row_stack = np.vstack

from numba import config, cuda, float32  # noqa: E402

config.CUDA_LOW_OCCUPANCY_WARNINGS = 0  # the decode step's tensors are small by nature

#: threads per block of the row kernels (size of their shared-memory reduction)
NORM_THREADS = 128


@cuda.jit(device=True)
def unravel(i, shape):
    i3 = i % shape[3]
    i //= shape[3]
    i2 = i % shape[2]
    i //= shape[2]
    i1 = i % shape[1]
    return i // shape[1], i1, i2, i3


@cuda.jit(device=True)
def silu(x):
    return x / (float32(1.0) + math.exp(-x))


@cuda.jit(device=True)
def sigmoid(x):
    return float32(1.0) / (float32(1.0) + math.exp(-x))


@cuda.jit(device=True)
def op_add(x, y):
    return x + y


@cuda.jit(device=True)
def op_mul(x, y):
    return x * y


@cuda.jit(device=True)
def op_div(x, y):
    return x / y


@cuda.jit(device=True)
def op_swiglu(x, y):
    return silu(x) * y


@cuda.jit(device=True)
def op_softplus(x):
    return x if x > float32(20.0) else math.log1p(math.exp(min(x, float32(20.0))))


@cuda.jit(device=True)
def op_copy(x):
    return x


def _binary(op):
    @cuda.jit
    def kernel(d, a, b):
        i = cuda.grid(1)
        if i < d.size:
            a0, a1, a2, a3 = unravel(i, a.shape)
            b0, b1, b2, b3 = unravel(i, b.shape)
            d0, d1, d2, d3 = unravel(i, d.shape)
            d[d0, d1, d2, d3] = op(a[a0, a1, a2, a3], b[b0, b1, b2, b3])
    return kernel


def _unary(op):
    @cuda.jit
    def kernel(d, a):
        i = cuda.grid(1)
        if i < d.size:
            a0, a1, a2, a3 = unravel(i, a.shape)
            d0, d1, d2, d3 = unravel(i, d.shape)
            d[d0, d1, d2, d3] = op(a[a0, a1, a2, a3])
    return kernel


add = _binary(op_add)
mul = _binary(op_mul)
div = _binary(op_div)
swiglu = _binary(op_swiglu)
sigmoid_k = _unary(sigmoid)
softplus = _unary(op_softplus)
silu_k = _unary(silu)


@cuda.jit
def swiglu_oai(d, g, u, alpha, limit):
    """gpt-oss: (clip(u, -limit, limit) + 1) * min(g, limit) * sigmoid(alpha * min(g, limit))."""
    i = cuda.grid(1)
    if i < d.size:
        g0, g1, g2, g3 = unravel(i, g.shape)
        u0, u1, u2, u3 = unravel(i, u.shape)
        d0, d1, d2, d3 = unravel(i, d.shape)
        x = min(g[g0, g1, g2, g3], limit)
        y = min(max(u[u0, u1, u2, u3], -limit), limit)
        d[d0, d1, d2, d3] = (y + float32(1.0)) * (x * sigmoid(x * alpha))


@cuda.jit
def scale(d, a, s):
    i = cuda.grid(1)
    if i < d.size:
        a0, a1, a2, a3 = unravel(i, a.shape)
        d0, d1, d2, d3 = unravel(i, d.shape)
        d[d0, d1, d2, d3] = a[a0, a1, a2, a3] * s


@cuda.jit
def add_chain(d, a, b, c, e, n):
    """ADD_CHAIN (the add-chain fusion): ((a + b) + c) + e, the last only when n == 4."""
    i = cuda.grid(1)
    if i < d.size:
        a0, a1, a2, a3 = unravel(i, a.shape)
        b0, b1, b2, b3 = unravel(i, b.shape)
        c0, c1, c2, c3 = unravel(i, c.shape)
        d0, d1, d2, d3 = unravel(i, d.shape)
        r = (a[a0, a1, a2, a3] + b[b0, b1, b2, b3]) + c[c0, c1, c2, c3]
        if n > 3:
            e0, e1, e2, e3 = unravel(i, e.shape)
            r = r + e[e0, e1, e2, e3]
        d[d0, d1, d2, d3] = r


RMS, RMS_MUL, L2, GATED, RMS_MUL_ADD = 0, 1, 2, 3, 4


def _norm(kind):
    """One block of NORM_THREADS per row: shared-memory tree sum of squares, then the scaled row
    (times the weight; times silu(z) for NORM_GATED). w and z are aligned to x's shape."""

    @cuda.jit
    def kernel(d, x, w, z, eps):
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        length = x.shape[3]
        r0, r1, r2, _ = unravel(r * length, x.shape)
        part = cuda.shared.array(NORM_THREADS, float32)
        ss = float32(0.0)
        for j in range(t, length, NORM_THREADS):
            v = x[r0, r1, r2, j]
            ss += v * v
        part[t] = ss
        cuda.syncthreads()
        step = NORM_THREADS // 2
        while step > 0:
            if t < step:
                part[t] += part[t + step]
            cuda.syncthreads()
            step //= 2
        total = part[0]
        if kind == L2:
            inv = float32(1.0) / max(math.sqrt(total), eps)
        else:
            inv = float32(1.0) / math.sqrt(total / length + eps)
        for j in range(t, length, NORM_THREADS):
            v = x[r0, r1, r2, j] * inv
            if kind == RMS_MUL or kind == GATED or kind == RMS_MUL_ADD:
                v *= w[r0, r1, r2, j]
            if kind == GATED:
                v *= silu(z[r0, r1, r2, j])
            if kind == RMS_MUL_ADD:
                v += z[r0, r1, r2, j]
            d[r0, r1, r2, j] = v
    return kernel


_rms = _norm(RMS)
_rms_mul = _norm(RMS_MUL)
_l2 = _norm(L2)
_gated = _norm(GATED)
_rms_mul_add = _norm(RMS_MUL_ADD)


class _Launcher:
    """``kernel[grid, block, stream](*args)`` with the CUDA C argument order of one op."""

    def __init__(self, kernel, arrange):
        self.kernel, self.arrange = kernel, arrange
        self.__name__ = getattr(kernel, "__name__", "numba_kernel")

    def __getitem__(self, config):
        configured = self.kernel[config]
        return lambda *args: configured(*self.arrange(args))


#: CUDA C kernel name (without ``k_``) -> Numba kernel taking the same arguments
KERNELS = {
    "add": add, "add_chain": add_chain, "mul": mul, "div": div, "swiglu": swiglu,
    "swiglu_oai": swiglu_oai, "scale": scale,
    "sigmoid": sigmoid_k, "softplus": softplus, "silu": silu_k,
    "rms_norm": _Launcher(_rms, lambda a: (a[0], a[1], a[1], a[1], a[2])),
    "rms_norm_mul": _Launcher(_rms_mul, lambda a: (a[0], a[1], a[2], a[1], a[3])),
    "l2_norm": _Launcher(_l2, lambda a: (a[0], a[1], a[1], a[1], a[2])),
    "norm_gated": _Launcher(_gated, lambda a: (a[0], a[1], a[2], a[3], a[4])),
    "rms_norm_mul_add": _Launcher(_rms_mul_add, lambda a: (a[0], a[1], a[2], a[3], a[4])),
}
