"""Graph IR: buffers, strided views, ops with declared reads/writes and cost, graphs."""

from .graph import Graph, GraphBuilder, Node
from .ops import KERNEL_FAMILIES, OPS, OpInfo, op_info
from .tensor import BLOCK_TYPES, DTYPES, Buffer, View, contiguous_strides, is_quantized, itemsize

__all__ = [
    "BLOCK_TYPES", "DTYPES", "KERNEL_FAMILIES", "OPS", "Buffer", "Graph", "GraphBuilder", "Node", "OpInfo", "View",
    "contiguous_strides", "is_quantized", "itemsize", "op_info",
]
