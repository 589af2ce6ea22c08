"""NumPy twins of the gated-delta-net ops (Qwen3-Next linear attention).

SSM_CONV and GATED_DELTA_NET have two outputs: the result and the new recurrent state. Each is
written to the view ``node.outs[i]`` names, wherever it lies (the op's output tail in the model
graph, the state cache itself once ``copy-elim`` redirects it), and every source is read in full
before anything is written, so an in-place state update is safe.
"""

from __future__ import annotations

import numpy as np

from ..graph import Node
from .memory import Memory
from .reference_base import _out, _src, numpy_op, rms_norm, silu


@numpy_op("SILU")
def op_silu(node: Node, mem: Memory) -> None:
    _out(node, mem, silu(_src(node, mem, 0)))


@numpy_op("L2_NORM")
def op_l2_norm(node: Node, mem: Memory) -> None:
    """ggml_l2_norm: ``x / max(||x||, eps)`` along the last axis."""
    x = _src(node, mem, 0)
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    _out(node, mem, x / np.maximum(norm, np.float32(node.params["eps"])))


@numpy_op("NORM_GATED")
def op_norm_gated(node: Node, mem: Memory) -> None:
    """``rms_norm(x) * w * silu(z)`` per head (HF ``Qwen3NextRMSNormGated``)."""
    x, w, z = (_src(node, mem, i) for i in range(3))
    _out(node, mem, rms_norm(x, node.params["eps"]) * w * silu(z))


@numpy_op("SSM_CONV")
def op_ssm_conv(node: Node, mem: Memory) -> None:
    """Depthwise causal conv of one token. srcs: conv state [C, K-1] (oldest first), x [.., C],
    kernel [C, K]; outs: the conv output [.., C] and the new conv state [C, K-1]."""
    state, kernel = _src(node, mem, 0), _src(node, mem, 2)
    x = _src(node, mem, 1).reshape(-1)
    window = np.concatenate([state, x[:, None]], axis=1)  # [C, K]
    _out(node, mem, np.sum(window * kernel, axis=1), 0)
    _out(node, mem, window[:, 1:], 1)


def gated_delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                     state: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One token of the gated delta rule per value head.

    q, k [H, d_k] (already L2-normalised), v [H, d_v], g (log decay) and beta [H],
    state [H, d_k, d_v]. Returns (output [H, d_v], new state)."""
    s = state * np.exp(g)[:, None, None]
    kv_mem = np.einsum("hkv,hk->hv", s, k)
    delta = (v - kv_mem) * beta[:, None]
    s = s + k[:, :, None] * delta[:, None, :]
    return np.einsum("hkv,hk->hv", s, q) * np.float32(scale), s


@numpy_op("GATED_DELTA_NET")
def op_gated_delta_net(node: Node, mem: Memory) -> None:
    """srcs: q, k (each [H_v, d_k] after flattening the leading axes; may be broadcast views),
    v [H_v, d_v], g [H_v], beta [H_v], state [H_v, d_k, d_v]; outs: output, new state."""
    state = _src(node, mem, 5)
    h_v, d_k, _ = state.shape
    q, k, v, g, beta = (_src(node, mem, i) for i in range(5))
    out, new_state = gated_delta_rule(q.reshape(h_v, d_k), k.reshape(h_v, d_k), v.reshape(h_v, -1),
                                      g.reshape(h_v), beta.reshape(h_v), state, node.params["scale"])
    _out(node, mem, out, 0)
    _out(node, mem, new_state, 1)
