// Shared vocabulary of the workbench's CUDA kernels (compiled by NVRTC through CuPy RawModule).
//
// * TV: a tensor view exactly as the graph IR has it (base pointer = buffer + byte offset, byte
//   strides, shape in numpy order left-padded to 4 dims, dtype code), passed by value, so every
//   kernel honours the strides and offsets of every view (copy elimination, the allocator's
//   arena placement and strided q/k/v splits need nothing else).
// * Number formats without headers: f16 and bf16 are raw 16-bit words converted with PTX, so the
//   same source compiles under NVRTC and `nvcc --ptx` with no include path beyond this folder.
// * PDL hooks: PDL_WAIT(where) / PDL_TRIGGER(where) mark every candidate position in a kernel;
//   the compile-time defines PDL_WAIT_AT / PDL_TRIGGER_AT (one module per placement) keep
//   exactly one of each, so the position follows the Plan's placement.
// * Code size: a kernel that few warps run once fetches each of its instructions cold, so its
//   time grows with the code it walks. Unrolled loops over unused slots and inlined libm calls
//   per element made k_rms_norm_mul_rope 92 KB and 9.4 us; sized to the head with a rolled
//   rotation loop, 19.6 KB and 4.9 us (data/bench/fusion_kernels_h100.md).
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_I64 4

struct TV {
    char* p;      // first byte of the view (buffer base + view offset)
    i64 s[4];     // byte strides; 0 on a broadcast axis
    int n[4];     // shape, numpy order, left-padded with 1
    int dt;       // DT_* code
    int pad;
};

// ---------------------------------------------------------------------------------------------
// PDL placement. Positions: start (before anything), first_read (after index math and reads of
// weights/constants, before the first read of anything an earlier kernel writes), late (after
// the first dependent read: a deliberate race, for studying it), after_main_loop, end.
#define PDL_AT_none 0
#define PDL_AT_start 1
#define PDL_AT_first_read 2
#define PDL_AT_late 3
#define PDL_AT_after_main_loop 4
#define PDL_AT_end 5

#ifndef PDL_WAIT_AT
#define PDL_WAIT_AT PDL_AT_none
#endif
#ifndef PDL_TRIGGER_AT
#define PDL_TRIGGER_AT PDL_AT_none
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_GRID_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_GRID_WAIT() do {} while (0)
#define PDL_GRID_TRIGGER() do {} while (0)
#endif

#define PDL_WAIT(where) do { if (PDL_WAIT_AT == PDL_AT_##where) PDL_GRID_WAIT(); } while (0)
#define PDL_TRIGGER(where) do { if (PDL_TRIGGER_AT == PDL_AT_##where) PDL_GRID_TRIGGER(); } while (0)

// ---------------------------------------------------------------------------------------------
// Number formats.
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
// Round to nearest even, the same formula as workbench.models.weights.to_bf16.
__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Loads and stores by dtype code. float32 (every activation) is the inlined fast path; the
// other formats go through one out-of-line function each, which keeps the unrolled kernels
// small (and NVRTC fast) at the cost of a call where a kernel touches f16/bf16/int data.
__device__ __noinline__ float ldf_other(const char* p, int dt) {
    switch (dt) {
        case DT_F16: return h2f(*(const u16*)p);
        case DT_BF16: return bf2f(*(const u16*)p);
        case DT_I32: return (float)*(const int*)p;
        default: return (float)*(const i64*)p;
    }
}
__device__ __forceinline__ float ldf(const char* p, int dt) {
    return dt == DT_F32 ? *(const float*)p : ldf_other(p, dt);
}
// The first dependent read of a kernel. Under the `late` placement it is volatile, so that the
// compiler cannot sink it past griddepcontrol.wait (the read really happens before the wait).
// Elsewhere it is a plain load: the wait's memory clobber already keeps it after the wait, and a
// volatile (system-scope) load costs every kernel that reads its input through it.
#if PDL_WAIT_AT == PDL_AT_late
#define WB_FIRST_READ volatile
#else
#define WB_FIRST_READ
#endif
__device__ __noinline__ float ldf_v_other(const char* p, int dt) {
    switch (dt) {
        case DT_F16: return h2f(*(const WB_FIRST_READ u16*)p);
        case DT_BF16: return bf2f(*(const WB_FIRST_READ u16*)p);
        case DT_I32: return (float)*(const WB_FIRST_READ int*)p;
        default: return (float)*(const WB_FIRST_READ i64*)p;
    }
}
__device__ __forceinline__ float ldf_v(const char* p, int dt) {
    return dt == DT_F32 ? *(const WB_FIRST_READ float*)p : ldf_v_other(p, dt);
}
__device__ __forceinline__ i64 ldi(const char* p, int dt) {
    return dt == DT_I64 ? *(const i64*)p : (i64)*(const int*)p;
}
__device__ __forceinline__ i64 ldi_v(const char* p, int dt) {
    return dt == DT_I64 ? *(const WB_FIRST_READ i64*)p : (i64)*(const WB_FIRST_READ int*)p;
}
__device__ __noinline__ void stf_other(char* p, int dt, float v) {
    switch (dt) {
        case DT_F16: *(u16*)p = f2h(v); break;
        case DT_BF16: *(u16*)p = f2bf(v); break;
        case DT_I32: *(int*)p = (int)v; break;
        default: *(i64*)p = (i64)v;
    }
}
__device__ __forceinline__ void stf(char* p, int dt, float v) {
    if (dt == DT_F32) *(float*)p = v;
    else stf_other(p, dt, v);
}

// ---------------------------------------------------------------------------------------------
// Geometry.
__device__ __forceinline__ int tv_numel(const TV& v) { return v.n[0] * v.n[1] * v.n[2] * v.n[3]; }
__device__ __forceinline__ int tv_rows(const TV& v) { return v.n[0] * v.n[1] * v.n[2]; }

// Byte offset of flat (numpy order) element index i (< the shape's size) of a view of shape
// `shape` in view v. Leading axes of size 1 (a decode step's [1, 1, 1, n] and [1, 1, rows, n]
// shapes) skip their integer divisions: a division by a runtime value is a dependent chain of
// tens of instructions, paid before a short kernel's first load.
__device__ __forceinline__ i64 tv_off(const TV& v, const int* shape, int i) {
    if (shape[0] == 1 && shape[1] == 1 && shape[2] == 1) return (i64)i * v.s[3];
    int i3 = i % shape[3]; i /= shape[3];
    if (shape[0] == 1 && shape[1] == 1) return (i64)i * v.s[2] + (i64)i3 * v.s[3];
    int i2 = i % shape[2]; i /= shape[2];
    int i1 = i % shape[1]; i /= shape[1];
    return (i64)i * v.s[0] + (i64)i1 * v.s[1] + (i64)i2 * v.s[2] + (i64)i3 * v.s[3];
}
// Byte offset of row r (< the rows of `shape`, flat over the first three dims) of v, rows laid
// out as in `shape` (one axis of rows: no division).
__device__ __forceinline__ i64 tv_row_off(const TV& v, const int* shape, int r) {
    if (shape[0] == 1 && shape[1] == 1) return (i64)r * v.s[2];
    int i2 = r % shape[2]; r /= shape[2];
    int i1 = r % shape[1]; r /= shape[1];
    return (i64)r * v.s[0] + (i64)i1 * v.s[1] + (i64)i2 * v.s[2];
}

// ---------------------------------------------------------------------------------------------
// Reductions.
#define WB_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float redm[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) redm[warp] = v;
    __syncthreads();
    v = lane < nw ? redm[lane] : -WB_INF;
    return warp_max(v);
}

// One q8_1 block (f16 d, f16 s, int8 qs[32]: 36 bytes at yb) from the 32 values a warp holds, lane
// c holding value c: d = amax / 127, q = roundf(x / d), s = the block's float sum, as ggml's
// quantize_q8_1 writes it. Every lane of the warp must call it.
__device__ __forceinline__ void warp_store_q8_1(char* yb, float v, int c) {
    const float amax = warp_max(fabsf(v));
    const float sum = warp_sum(v);
    const float dd = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(v / dd);
    yb[4 + c] = (char)q;
    if (c == 0) {
        *(u16*)yb = f2h(dd);
        *(u16*)(yb + 2) = f2h(sum);
    }
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
