// Block-quantised weights, llama.cpp's mmvq path: QUANTIZE_Q8_1 (the f32 activation as q8_1
// blocks), MUL_MAT and MUL_MAT_ID of q8_0 / q4_0 / q4_k / mxfp4 weights with that q8_1
// activation in integer dot products (dp4a), and GET_ROWS of a quantised table (dequantised rows).
//
// Byte layouts are ggml's (workbench/models/quant.py writes them bit-exact):
//   q8_1  36 B: f16 d, f16 s (the block's float sum), int8 qs[32]
//   q8_0  34 B: f16 d, int8 qs[32]
//   q4_0  18 B: f16 d, qs[16] (value j in the low nibble of byte j, j + 16 in the high one), q - 8
//   mxfp4 17 B: e8m0 e, qs[16] (nibbles as q4_0, e2m1 codes: kvalues_mxfp4 doubled, scale halved)
//   q4_k 144 B: f16 d, f16 dmin, scales[12] (6-bit scales and mins of 8 groups), qs[128]
// The dot products follow vecdotq.cuh (vec_dot_*_q8_1 with VDR_*_MMVQ = 2): each thread takes
// `vdr` 32-bit words of a weight block and QI / VDR threads share a block. Every type computes
// exactly the products of the dequantised blocks (the reference's), in another order: q4_0's
// "- 8" is 8 sum(q8) from a dp4a with 0x01010101, as vec_dot_q4_K takes its mins, where llama.cpp
// uses the block's float sum s (ds.y), which differs by 8 d4 (s - d8 sum(q8)) per block, about
// the q8_1 rounding error of the activation. The s that k_quantize_q8_1 writes stays ggml's.
//
// Work split (mul_mat_vec_q for one token): a warp per R output rows, its lanes strided over the
// rows' blocks and reduced by shuffles, or (wpr > 1) wpr warps per row, each taking every wpr-th
// pass of the row's blocks, their sums added through shared memory; MMVQ_WARPS warps a block.
// llama.cpp gives every row a block of 4 warps; in whole decode steps that split is 30 % slower
// here than the binder's pick by output count (data/bench/launch_policy_h200.md), which keeps
// wpr = 4 for short matrices only. grid = (row groups, activation rows | selected experts). Under PDL the mat-vec prefetches its first
// weight blocks to L2 before its wait; the expert variant learns its rows from ids only after it.
//
// Unaligned reads: q8_0 and q4_0 blocks are 2-byte aligned, mxfp4 blocks byte aligned, q4_k and
// q8_1 blocks 4-byte aligned (the bindings check the views' bytes accordingly).
#include "common.cuh"

// Work split, swept by benchmarks/mmvq_sweep.py: MMVQ_WARPS warps a block, each owning R output
// rows (1, 2 or 4: the kernel's rpw) or a 1 / wpr share of one row's blocks (wpr 2 or 4), as
// workbench/exec/cuda_quant_ops.py mmvq_split picks by output count and K, with U block passes in
// flight (MMVQ_UNROLL, else 1 for a single row and 4 for more).
#ifndef MMVQ_WARPS
#define MMVQ_WARPS 4
#endif
#define MMVQ_MAX_RPW 4
#ifdef MMVQ_UNROLL
#define MMVQ_U(R) MMVQ_UNROLL
#else
#define MMVQ_U(R) ((R) == 1 ? 1 : 4)
#endif
#define QK8_1 32
#define Q8_1_BYTES 36

#define QT_Q8_0 0
#define QT_Q4_0 1
#define QT_Q4_K 2
#define QT_MXFP4 3

typedef unsigned char u8;

// QK values per block, QI 32-bit words of quants per block (as ggml counts them), VDR words per thread.
template <int T> struct QTraits;
template <> struct QTraits<QT_Q8_0> { static constexpr int QK = 32, QI = 8, VDR = 2, BYTES = 34; };
template <> struct QTraits<QT_Q4_0> { static constexpr int QK = 32, QI = 4, VDR = 2, BYTES = 18; };
template <> struct QTraits<QT_Q4_K> { static constexpr int QK = 256, QI = 32, VDR = 2, BYTES = 144; };
template <> struct QTraits<QT_MXFP4> { static constexpr int QK = 32, QI = 4, VDR = 2, BYTES = 17; };

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// __byte_perm: byte n of the result is byte (nibble n of s) & 7 of a (bytes 0..3), b (4..7); the fourth
// selector bits are cleared, as prmt would otherwise sign-replicate the byte (ggml's lookup relies on it).
__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 s) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s & 0x7777u));
    return r;
}
// A 32-bit word of quants at byte p: byte / 2-byte / 4-byte aligned loads.
__device__ __forceinline__ int ld_b1(const u8* p) {
    return (int)((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
}
__device__ __forceinline__ int ld_b2(const u8* p) {
    const u16* h = (const u16*)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}
__device__ __forceinline__ int ld_b4(const u8* p) { return *(const int*)p; }
__device__ __forceinline__ float ld_h(const u8* p) { return h2f(*(const u16*)p); }

// e8m0 exponent -> 2^(e - 128): ggml_cuda_e8m0_to_fp32(e) * 0.5 (the halved mxfp4 scale).
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}
// kvalues_mxfp4 {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} as four words.
#define KV0 0x03020100u
#define KV1 0x0C080604u
#define KV2 0xFDFEFF00u
#define KV3 0xF4F8FAFCu
// get_int_from_table_16: the 8 nibbles of q4 looked up; `lo` the low nibbles', `hi` the high ones'.
__device__ __forceinline__ void mxfp4_lookup(int q4, int& lo_out, int& hi_out) {
    const u32 q = (u32)q4;
    const u32 sel = 0x32103210u | ((q & 0x88888888u) >> 1);
    u32 t[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 sh = 16 * i;
        const u32 lo = byte_perm(KV0, KV1, q >> sh);
        const u32 hi = byte_perm(KV2, KV3, q >> sh);
        t[i] = byte_perm(lo, hi, sel >> sh);
    }
    lo_out = (int)byte_perm(t[0], t[1], 0x6420);
    hi_out = (int)byte_perm(t[0], t[1], 0x7531);
}

// ---------------------------------------------------------------------------------------------
// vec_dot_<type>_q8_1: words iqs .. iqs + VDR - 1 of weight block `b` with the q8_1 block(s) `y`.
template <int T> __device__ __forceinline__ float vec_dot(const u8* b, const u8* y, int iqs);

template <> __device__ __forceinline__ float vec_dot<QT_Q8_0>(const u8* b, const u8* y, int iqs) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) s = dp4a(ld_b2(b + 2 + 4 * (iqs + i)), ld_b4(y + 4 + 4 * (iqs + i)), s);
    return ld_h(b) * ld_h(y) * (float)s;
}

template <> __device__ __forceinline__ float vec_dot<QT_Q4_0>(const u8* b, const u8* y, int iqs) {
    int s = 0, sq = 0;  // sum(q4 * q8) and sum(q8) over this thread's values
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int v = ld_b2(b + 2 + 4 * (iqs + i));
        const int u0 = ld_b4(y + 4 + 4 * (iqs + i)), u1 = ld_b4(y + 4 + 4 * (iqs + i + 4));
        s = dp4a((v >> 4) & 0x0F0F0F0F, u1, dp4a(v & 0x0F0F0F0F, u0, s));
        sq = dp4a(0x01010101, u1, dp4a(0x01010101, u0, sq));
    }
    return ld_h(b) * ld_h(y) * (float)(s - 8 * sq);  // sum((q4 - 8) * q8), exact in int
}

template <> __device__ __forceinline__ float vec_dot<QT_MXFP4>(const u8* b, const u8* y, int iqs) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int lo, hi;
        mxfp4_lookup(ld_b1(b + 1 + 4 * (iqs + i)), lo, hi);
        s = dp4a(lo, ld_b4(y + 4 + 4 * (iqs + i)), s);
        s = dp4a(hi, ld_b4(y + 4 + 4 * (iqs + i + 4)), s);
    }
    return e8m0_half(b[0]) * ld_h(y) * (float)s;
}

// q4_k: iqs in 0, 2, .., 30; `y` is the first of the super-block's 8 q8_1 blocks.
template <> __device__ __forceinline__ float vec_dot<QT_Q4_K>(const u8* b, const u8* y, int iqs) {
    const int bq8 = 2 * ((iqs / 2) / 4);  // q8_1 blocks bq8, bq8 + 1: groups of 32 values
    const int r = (iqs / 2) % 4;
    const u8* q4 = b + 16 + 16 * bq8 + 4 * r;
    const int v0 = ld_b4(q4), v1 = ld_b4(q4 + 16);
    const u16* sc16 = (const u16*)(b + 4);
    const int j = bq8 / 2, jm = j & 1;
    const u32 s0 = sc16[jm], s2 = sc16[jm + 2], s4 = sc16[jm + 4];
    const u32 hi = (u32)(-(int)(j >= 2));
    const u32 a0 = ((s0 & 0x3f3fu) & ~hi) | ((((s4 >> 0) & 0x0f0fu) | ((s0 & 0xc0c0u) >> 2)) & hi);
    const u32 a1 = ((s2 & 0x3f3fu) & ~hi) | ((((s4 >> 4) & 0x0f0fu) | ((s2 & 0xc0c0u) >> 2)) & hi);
    float sum_d = 0.0f, sum_m = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* yi = y + Q8_1_BYTES * (bq8 + i);
        const float d8 = ld_h(yi);
        const int u0 = ld_b4(yi + 4 + 4 * r), u1 = ld_b4(yi + 4 + 4 * (r + 4));
        const int w0 = (v0 >> (4 * i)) & 0x0F0F0F0F, w1 = (v1 >> (4 * i)) & 0x0F0F0F0F;
        const int dot1 = dp4a(w1, u1, dp4a(w0, u0, 0));
        const int dot2 = dp4a(0x01010101, u1, dp4a(0x01010101, u0, 0));  // sum of the q8 values
        const int sc = (a0 >> (8 * i)) & 0xff, m = (a1 >> (8 * i)) & 0xff;
        sum_d += d8 * (float)(dot1 * sc);
        sum_m += d8 * (float)(dot2 * m);
    }
    return ld_h(b) * sum_d - ld_h(b + 2) * sum_m;
}

// The dots of this warp's R weight rows `wr` with the activation row `y` (its q8_1 blocks,
// contiguous): lane takes words iqs.. of blocks part * 32 / TPB + lane / TPB, strided by the
// 32 / TPB blocks a warp pass covers times the `parts` warps that share the rows (split-K). The R
// rows share each pass, and U passes issue their loads together, so a warp keeps R x U blocks per
// lane in flight instead of paying a DRAM round trip per pass.
template <int T, int R, int U>
__device__ __forceinline__ void rows_dot_q(const u8* const (&wr)[R], const u8* y, int nblocks, int lane, int part,
                                           int parts, float (&acc)[R]) {
    typedef QTraits<T> Q;
    constexpr int TPB = Q::QI / Q::VDR, STEP = 32 / TPB;
    const int iqs = Q::VDR * (lane % TPB), stride = STEP * parts;
    for (int kb0 = part * STEP + lane / TPB; kb0 < nblocks; kb0 += stride * U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kb = kb0 + u * stride;
            if (kb < nblocks) {
                const u8* yb = y + (i64)kb * (Q::QK / QK8_1) * Q8_1_BYTES;
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r] += vec_dot<T>(wr[r] + (i64)kb * Q::BYTES, yb, iqs);
            }
        }
    }
}

// rows_per_warp `rpw` (uniform over the grid) picks the instance: 4, 2, else 1 (two matrices:
// 2, else 1, so a GLU warp keeps at most as many rows in flight as a plain one). Warps that split
// a row's blocks (wpr > 1) own one row each: the binder passes rpw = 1 with them.
#define MMVQ_DISPATCH(F, T, G, ...)                                                                     \
    (rpw == 4 && G == 1 ? F<T, 4, G>(__VA_ARGS__) : rpw >= 2 ? F<T, 2, G>(__VA_ARGS__) : F<T, 1, G>(__VA_ARGS__))

// Epilogues: the plain dot; + an addend of the result's shape (mul-mat-add: a bias or the
// residual); swiglu of a gate row and an up row (mul-mat-glu: G = 2 weight matrices).
#define EPI_NONE 0
#define EPI_ADD 1
#define EPI_GLU 2

// Byte offset of weight row `row` (clamped to the last: a warp past the matrix reads a valid row
// and stores nothing): expert e's row of [E, N, K], or for e < 0 row `row` flat over TV axes 0..2
// (a view may order them as it likes: qwen3-next's Q/K split of a fused projection does).
__device__ __forceinline__ i64 q_row_off(const TV& w, i64 e, int row, int N) {
    row = min(row, N - 1);
    return e >= 0 ? e * w.s[1] + (i64)row * w.s[2] : tv_row_off(w, w.n, row);
}

// The R rows from row0 of a warp in each of the G matrices w[0..G-1] (a gate and an up for G = 2):
// their dots with y over this warp's share of the blocks (part of parts), warp-reduced into
// sums[g][0..R-1] (every lane).
template <int T, int R, int G>
__device__ __forceinline__ void warp_rows(const TV (&w)[G], i64 e, const u8* y, int N, int nb, int row0, int lane,
                                          int part, int parts, float (&sums)[G][MMVQ_MAX_RPW]) {
    const u8* wr[G * R];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int r = 0; r < R; ++r) wr[g * R + r] = (const u8*)(w[g].p + q_row_off(w[g], e, row0 + r, N));
    float acc[G * R] = {};
    rows_dot_q<T, G * R, MMVQ_U(G * R)>(wr, y, nb, lane, part, parts, acc);
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int r = 0; r < R; ++r) sums[g][r] = warp_sum(acc[g * R + r]);
}

// Lane 0 stores the warp's rpw results at flat index `out + row` (rows < N), through the epilogue.
template <int EPI, int G>
__device__ __forceinline__ void store_rows(TV d, TV b, i64 out, int row0, int N, int rpw, int lane,
                                           const float (&sums)[G][MMVQ_MAX_RPW]) {
#pragma unroll
    for (int r = 0; r < MMVQ_MAX_RPW; ++r) {
        if (r < rpw && lane == 0 && row0 + r < N) {
            const i64 o = out + row0 + r;
            float v = sums[0][r];
            if (EPI == EPI_ADD) v += ldf(b.p + tv_off(b, b.n, o), b.dt);
            if (EPI == EPI_GLU) v = silu_f(v) * sums[G - 1][r];
            stf(d.p + tv_off(d, d.n, o), d.dt, v);
        }
    }
}

// Warps that split a row's blocks (wpr > 1, one row each): part 0 of each group adds the other
// parts' sums, in part order (a barrier: every thread of the block calls it).
template <int G>
__device__ __forceinline__ void parts_sum(int wpr, int warp, int lane, float (&sums)[G][MMVQ_MAX_RPW]) {
    if (wpr == 1) return;
    __shared__ float red[MMVQ_WARPS][G];
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < G; ++g) red[warp][g] = sums[g][0];
    __syncthreads();
    if (warp % wpr == 0)
        for (int p = 1; p < wpr; ++p)
#pragma unroll
            for (int g = 0; g < G; ++g) sums[g][0] += red[warp + p][g];
}

// MUL_MAT (+ ADD, GLU): d (flat [M, N]) = epilogue(w . x), w rows flat over TV axes 0..2 with K on
// axis 3 (G of them: the gate and the up of GLU), x q8_1 [M, K]; b the ADD's addend, aligned to d.
// Warp `warp` of block i is part warp % wpr of group (i MMVQ_WARPS + warp) / wpr, which owns
// the `rpw` consecutive rows from that group index times rpw.
template <int T, int EPI, int G>
__device__ __forceinline__ void mmvq(TV d, const TV (&w)[G], TV x, TV b, int rpw, int wpr) {
    typedef QTraits<T> Q;
    constexpr int TPB = Q::QI / Q::VDR;
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % wpr, m = blockIdx.y;
    const int N = tv_rows(w[0]), nb = w[0].n[3] / Q::QK, kb = part * (32 / TPB) + lane / TPB;
    const int row0 = (blockIdx.x * (MMVQ_WARPS / wpr) + warp / wpr) * rpw;
    // weights never change during a step: this lane's first blocks head for L2 before the wait
    if (kb < nb)
        for (int g = 0; g < G; ++g)
            for (int r = 0; r < rpw; ++r)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w[g].p + q_row_off(w[g], -1, row0 + r, N) +
                                                                (i64)kb * Q::BYTES));
    PDL_WAIT(first_read);
    const u8* y = (const u8*)(x.p + tv_row_off(x, x.n, m));
#if PDL_WAIT_AT == PDL_AT_late
    const int y0 = *(const volatile int*)y;  // the first dependent read (the `late` placement's race)
#else
    const int y0 = 0;  // no extra read where nothing studies it: the main loop's loads come first
#endif
    PDL_WAIT(late);
    float sums[G][MMVQ_MAX_RPW] = {};
    MMVQ_DISPATCH(warp_rows, T, G, w, -1, y, N, nb, row0, lane, part, wpr, sums);
    sums[0][0] += (float)(y0 & 0);
    PDL_TRIGGER(after_main_loop);
    parts_sum<G>(wpr, warp, lane, sums);
    if (part == 0) store_rows<EPI, G>(d, b, (i64)m * N, row0, N, rpw, lane, sums);
    PDL_TRIGGER(end);
}

// MUL_MAT_ID (+ GLU): d[i] (flat [n_ids, N]) = epilogue(w[ids[i]] . x[i or 0]), w [E, N, K] on TV
// axes 1..3 (G of them); the warps' rows as in mmvq, blockIdx.y the selected expert's slot.
template <int T, int EPI, int G>
__device__ __forceinline__ void mmvq_id(TV d, const TV (&w)[G], TV x, TV ids, int rpw, int wpr) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % wpr, slot = blockIdx.y;
    const int N = w[0].n[2], nb = w[0].n[3] / QTraits<T>::QK;
    const int row0 = (blockIdx.x * (MMVQ_WARPS / wpr) + warp / wpr) * rpw;
    const int xrows = tv_rows(x);
    PDL_WAIT(first_read);
    const i64 e = ldi_v(ids.p + tv_off(ids, ids.n, slot), ids.dt);
    PDL_WAIT(late);
    const u8* y = (const u8*)(x.p + tv_row_off(x, x.n, xrows > 1 ? slot : 0));
    float sums[G][MMVQ_MAX_RPW] = {};
    MMVQ_DISPATCH(warp_rows, T, G, w, e, y, N, nb, row0, lane, part, wpr, sums);
    PDL_TRIGGER(after_main_loop);
    parts_sum<G>(wpr, warp, lane, sums);
    if (part == 0) store_rows<EPI, G>(d, d, (i64)slot * N, row0, N, rpw, lane, sums);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q8_0(TV d, TV w, TV x, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq<QT_Q8_0, EPI_NONE, 1>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q8_0_add(TV d, TV w, TV x, int rpw, int wpr, TV b) {
    const TV ws[1] = {w};
    mmvq<QT_Q8_0, EPI_ADD, 1>(d, ws, x, b, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q8_0_glu(TV d, TV wg, TV wu, TV x, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq<QT_Q8_0, EPI_GLU, 2>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q8_0(TV d, TV w, TV x, TV ids, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq_id<QT_Q8_0, EPI_NONE, 1>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q8_0_glu(TV d, TV wg, TV wu, TV x,
                                                                                     TV ids, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq_id<QT_Q8_0, EPI_GLU, 2>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_0(TV d, TV w, TV x, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq<QT_Q4_0, EPI_NONE, 1>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_0_add(TV d, TV w, TV x, int rpw, int wpr, TV b) {
    const TV ws[1] = {w};
    mmvq<QT_Q4_0, EPI_ADD, 1>(d, ws, x, b, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_0_glu(TV d, TV wg, TV wu, TV x, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq<QT_Q4_0, EPI_GLU, 2>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q4_0(TV d, TV w, TV x, TV ids, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq_id<QT_Q4_0, EPI_NONE, 1>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q4_0_glu(TV d, TV wg, TV wu, TV x,
                                                                                     TV ids, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq_id<QT_Q4_0, EPI_GLU, 2>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_k(TV d, TV w, TV x, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq<QT_Q4_K, EPI_NONE, 1>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_k_add(TV d, TV w, TV x, int rpw, int wpr, TV b) {
    const TV ws[1] = {w};
    mmvq<QT_Q4_K, EPI_ADD, 1>(d, ws, x, b, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_q4_k_glu(TV d, TV wg, TV wu, TV x, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq<QT_Q4_K, EPI_GLU, 2>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q4_k(TV d, TV w, TV x, TV ids, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq_id<QT_Q4_K, EPI_NONE, 1>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_q4_k_glu(TV d, TV wg, TV wu, TV x,
                                                                                     TV ids, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq_id<QT_Q4_K, EPI_GLU, 2>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_mxfp4(TV d, TV w, TV x, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq<QT_MXFP4, EPI_NONE, 1>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_mxfp4_add(TV d, TV w, TV x, int rpw, int wpr, TV b) {
    const TV ws[1] = {w};
    mmvq<QT_MXFP4, EPI_ADD, 1>(d, ws, x, b, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_mxfp4_glu(TV d, TV wg, TV wu, TV x, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq<QT_MXFP4, EPI_GLU, 2>(d, ws, x, d, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_mxfp4(TV d, TV w, TV x, TV ids, int rpw, int wpr) {
    const TV ws[1] = {w};
    mmvq_id<QT_MXFP4, EPI_NONE, 1>(d, ws, x, ids, rpw, wpr);
}
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) k_mul_mat_vec_q_id_mxfp4_glu(TV d, TV wg, TV wu, TV x,
                                                                                     TV ids, int rpw, int wpr) {
    const TV ws[2] = {wg, wu};
    mmvq_id<QT_MXFP4, EPI_GLU, 2>(d, ws, x, ids, rpw, wpr);
}

// ---------------------------------------------------------------------------------------------
// QUANTIZE_Q8_1: y (q8_1 blocks, rows as x's) = x (f32 or any float view, rows of K values,
// K a multiple of 32): a warp per block, d = amax / 127, q = roundf(x / d), s = the block's sum
// (quantize.cu's quantize_q8_1). One thread per value, 256 per block, so warps never straddle rows.
extern "C" __global__ void __launch_bounds__(256) k_quantize_q8_1(TV y, TV x) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tv_numel(x)) return;  // whole warps: the element count is a multiple of 32
    const int K = x.n[3], r = i / K, c = i % K;
    const i64 ox = tv_off(x, x.n, i);
    char* yb = y.p + tv_row_off(y, y.n, r) + (i64)(c / QK8_1) * y.s[3];
    PDL_WAIT(first_read);
    const float xi = ldf_v(x.p + ox, x.dt);
    PDL_WAIT(late);
    PDL_TRIGGER(after_main_loop);
    warp_store_q8_1(yb, xi, c % QK8_1);
    PDL_TRIGGER(end);
}

// ---------------------------------------------------------------------------------------------
// GET_ROWS of a quantised table: value j of block b, as workbench.models.quant.dequantize has it.
template <int T> __device__ __forceinline__ float dequant(const u8* b, int j);

template <> __device__ __forceinline__ float dequant<QT_Q8_0>(const u8* b, int j) {
    return ld_h(b) * (float)(signed char)b[2 + j];
}
template <> __device__ __forceinline__ float dequant<QT_Q4_0>(const u8* b, int j) {
    const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return ld_h(b) * (float)(q - 8);
}
template <> __device__ __forceinline__ float dequant<QT_MXFP4>(const u8* b, int j) {
    const int q = j < 16 ? (b[1 + j] & 15) : (b[1 + j - 16] >> 4);
    const u32 word = q < 4 ? KV0 : q < 8 ? KV1 : q < 12 ? KV2 : KV3;
    return e8m0_half(b[0]) * (float)(signed char)((word >> (8 * (q & 3))) & 0xff);
}
template <> __device__ __forceinline__ float dequant<QT_Q4_K>(const u8* b, int j) {
    const int c = j / 64, w = j % 64, g = 2 * c + (w >= 32);
    const u8 byte = b[16 + 32 * c + (w % 32)];
    const int q = w < 32 ? (byte & 15) : (byte >> 4);
    const u8* s = b + 4;  // get_scale_min_k4
    const int sc = g < 4 ? (s[g] & 63) : ((s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4));
    const int m = g < 4 ? (s[g + 4] & 63) : ((s[g + 4] >> 4) | ((s[g] >> 6) << 4));
    return ld_h(b) * (float)sc * (float)q - ld_h(b + 2) * (float)m;
}

// d (flat [n_ids, K]) = dequantised rows ids[.] of table ([rows, K] blocks: row axis 0, K on axis 3).
template <int T>
__device__ __forceinline__ void get_rows_q(TV d, TV table, TV ids) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int K = table.n[3];
    const bool ok = i < tv_numel(d);
    const int slot = i / K, j = i % K;
    PDL_WAIT(first_read);
    const i64 row = ok ? ldi_v(ids.p + tv_off(ids, ids.n, slot), ids.dt) : 0;
    PDL_WAIT(late);
    float v = 0.0f;
    if (ok) {
        const u8* b = (const u8*)(table.p + row * table.s[0] + (i64)(j / QTraits<T>::QK) * table.s[3]);
        v = dequant<T>(b, j % QTraits<T>::QK);
    }
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + tv_off(d, d.n, i), d.dt, v);
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_get_rows_q8_0(TV d, TV table, TV ids) { get_rows_q<QT_Q8_0>(d, table, ids); }
extern "C" __global__ void k_get_rows_q4_0(TV d, TV table, TV ids) { get_rows_q<QT_Q4_0>(d, table, ids); }
extern "C" __global__ void k_get_rows_q4_k(TV d, TV table, TV ids) { get_rows_q<QT_Q4_K>(d, table, ids); }
extern "C" __global__ void k_get_rows_mxfp4(TV d, TV table, TV ids) { get_rows_q<QT_MXFP4>(d, table, ids); }
