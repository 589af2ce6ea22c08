// The block mat-vec's load and dot helpers (shared by mul_mat.cu and fused_mat_vec.cu): 16-byte
// non-caching weight loads, the dot of one vector with its activations, and the software
// pipelined loop over one weight row (see mul_mat.cu for the work split and the PDL positions).
#pragma once
#include "common.cuh"

#define MMV_WARPS 8
#ifndef MMV_UNROLL
#define MMV_UNROLL 4
#endif
// the row-streaming kernel keeps a shallower ring: at one row a warp (llama-3.1-8b's o_proj and
// down) 3 and 4 are slower, in isolation and in whole decode steps (data/bench/grid_ab_rows_h200.md)
#ifndef MMV_ROWS_UNROLL
#define MMV_ROWS_UNROLL 2
#endif
// the deeper ring of the fused lm_head's _deep_ kernels (fused_mat_vec.cu fmv_rows_norm: tens of rows a warp)
#ifndef MMV_HEAD_UNROLL
#define MMV_HEAD_UNROLL 4
#endif

struct alignas(16) u32x4 { u32 x, y, z, w; };
struct alignas(16) f32x4 { float x, y, z, w; };

__device__ __forceinline__ u32x4 ld_stream(const char* p) {
    u32x4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float lo_f16(u32 u) { return h2f((u16)(u & 0xffffu)); }
__device__ __forceinline__ float hi_f16(u32 u) { return h2f((u16)(u >> 16)); }
__device__ __forceinline__ float lo_bf16(u32 u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_bf16(u32 u) { return __uint_as_float(u & 0xffff0000u); }

// Dot of one 16-byte weight vector with the matching activations (16-byte aligned).
template <int WDT>
__device__ __forceinline__ float dot16(const u32x4& w, const float* x, float acc) {
    if (WDT == DT_F32) {
        const f32x4 a = *(const f32x4*)x;
        acc = fmaf(__uint_as_float(w.x), a.x, acc);
        acc = fmaf(__uint_as_float(w.y), a.y, acc);
        acc = fmaf(__uint_as_float(w.z), a.z, acc);
        acc = fmaf(__uint_as_float(w.w), a.w, acc);
        return acc;
    }
    const f32x4 a = *(const f32x4*)x;
    const f32x4 b = *(const f32x4*)(x + 4);
    if (WDT == DT_F16) {
        acc = fmaf(lo_f16(w.x), a.x, acc); acc = fmaf(hi_f16(w.x), a.y, acc);
        acc = fmaf(lo_f16(w.y), a.z, acc); acc = fmaf(hi_f16(w.y), a.w, acc);
        acc = fmaf(lo_f16(w.z), b.x, acc); acc = fmaf(hi_f16(w.z), b.y, acc);
        acc = fmaf(lo_f16(w.w), b.z, acc); acc = fmaf(hi_f16(w.w), b.w, acc);
    } else {
        acc = fmaf(lo_bf16(w.x), a.x, acc); acc = fmaf(hi_bf16(w.x), a.y, acc);
        acc = fmaf(lo_bf16(w.y), a.z, acc); acc = fmaf(hi_bf16(w.y), a.w, acc);
        acc = fmaf(lo_bf16(w.z), b.x, acc); acc = fmaf(hi_bf16(w.z), b.y, acc);
        acc = fmaf(lo_bf16(w.w), b.z, acc); acc = fmaf(hi_bf16(w.w), b.w, acc);
    }
    return acc;
}

// MMV_UNROLL vectors at wp, wp + vs, ... into r (the loads of one group of a pipeline).
__device__ __forceinline__ void ld_group(u32x4 (&r)[MMV_UNROLL], const char* wp, i64 vs) {
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; ++u) r[u] = ld_stream(wp + u * vs);
}

// acc + the dots of one group r with the activations at xp, xp + xs, ... (in order)
template <int WDT>
__device__ __forceinline__ float dot_group(const u32x4 (&r)[MMV_UNROLL], const float* xp, int xs, float acc) {
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; ++u) acc = dot16<WDT>(r[u], xp + u * xs, acc);
    return acc;
}

// The pipelined loop over one weight row: `cur` holds the first MMV_UNROLL vectors (already
// issued); each iteration issues the next MMV_UNROLL before consuming the current ones.
// Where every lane has the same whole number of groups (step divides the row's vectors, and
// MMV_UNROLL the lane's), the loop runs without per-vector bounds checks or index arithmetic,
// two groups an iteration alternating between two register sets (no copies): a mat-vec with
// few warps an SM is bound by the instructions it issues per byte (ncu on llama-3.1-8b's Q/K/V:
// 0.44 instructions a cycle per scheduler; data/bench/kernels_s16_h200.md). Same order of sums.
template <int WDT>
__device__ __forceinline__ float row_dot(const char* wr, const float* xr, int nvec, int v, int step,
                                         u32x4 (&cur)[MMV_UNROLL]) {
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    float acc = 0.0f;
    const int n = nvec / step;  // vectors a lane
    if (n * step == nvec && n % MMV_UNROLL == 0) {
        const i64 vs = (i64)step * 16;
        const int xs = step * VEC;
        const char* wp = wr + (i64)v * 16;
        const float* xp = xr + (i64)v * VEC;
        u32x4 nxt[MMV_UNROLL];
        int k = 0;
        for (; k + 2 * MMV_UNROLL <= n; k += 2 * MMV_UNROLL) {
            ld_group(nxt, wp + (k + MMV_UNROLL) * vs, vs);
            acc = dot_group<WDT>(cur, xp + (i64)k * xs, xs, acc);
            if (k + 2 * MMV_UNROLL < n) ld_group(cur, wp + (k + 2 * MMV_UNROLL) * vs, vs);
            acc = dot_group<WDT>(nxt, xp + (i64)(k + MMV_UNROLL) * xs, xs, acc);
        }
        if (k < n) acc = dot_group<WDT>(cur, xp + (i64)k * xs, xs, acc);  // an odd number of groups
        return acc;
    }
    for (; v < nvec; v += MMV_UNROLL * step) {
        u32x4 nxt[MMV_UNROLL] = {};
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) {
            const int idx = v + (MMV_UNROLL + u) * step;
            if (idx < nvec) nxt[u] = ld_stream(wr + (i64)idx * 16);
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) {
            const int idx = v + u * step;
            if (idx < nvec) acc = dot16<WDT>(cur[u], xr + (i64)idx * VEC, acc);
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) cur[u] = nxt[u];
    }
    return acc;
}

__device__ __forceinline__ void prefetch(const char* wr, int nvec, int v, int step, bool valid,
                                         u32x4 (&cur)[MMV_UNROLL]) {
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; ++u) {
        const int idx = v + u * step;
        if (valid && idx < nvec) cur[u] = ld_stream(wr + (i64)idx * 16);
    }
}


// A pair of weight rows (a, b: GLU's gate and up rows, a rotation pair of Q/K/V rows) dotted with
// one x as one pipelined sequence per lane: J items of row a then J of row b (vectors v, v + step,
// ... < nvec; J padded so that 2 J is a multiple of MMV_UNROLL), MMV_UNROLL loads in flight. Row
// b's first loads are issued while row a's last are consumed, and the loads that run past the
// pair fetch the next pair's first vectors, so the pipeline drains neither between the two rows
// nor between a warp's pairs (each drain costs a DRAM round trip per pair).
struct RowPair {
    const char* a;
    const char* b;
    bool ok;  // false: the warp has no pair here (nothing is loaded)
};

__device__ __forceinline__ int pair_len(int nvec, int step) {
    constexpr int H = MMV_UNROLL > 1 ? MMV_UNROLL / 2 : 1;
    const int J = (nvec + step - 1) / step;
    return (J + H - 1) / H * H;
}

__device__ __forceinline__ void pair_load(const RowPair& p, int J, int nvec, int v, int step, int t, u32x4& slot) {
    const int idx = v + (t < J ? t : t - J) * step;
    if (p.ok && idx < nvec) slot = ld_stream((t < J ? p.a : p.b) + (i64)idx * 16);
}

// Issue the pair's first MMV_UNROLL items into cur (the weights only: before the PDL wait).
__device__ __forceinline__ void pair_prefetch(const RowPair& p, int nvec, int v, int step, u32x4 (&cur)[MMV_UNROLL]) {
    const int J = pair_len(nvec, step);
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; ++u) pair_load(p, J, nvec, v, step, u, cur[u]);
}

// One group (items t0 .. t0 + MMV_UNROLL - 1 of a pair of J vectors a row, J a multiple of
// MMV_UNROLL, so the group is one row's): each item's dot added to a (row a) or b (row b).
template <int WDT>
__device__ __forceinline__ void pair_group(const u32x4 (&r)[MMV_UNROLL], const float* xp, int xs, int t0, int J,
                                           float& a, float& b) {
    const bool in_a = t0 < J;
    const float* xg = xp + (i64)(in_a ? t0 : t0 - J) * xs;
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; ++u) {
        const float s = dot16<WDT>(r[u], xg + u * xs, 0.0f);
        if (in_a) a += s; else b += s;
    }
}

// Issue group t of the pair whose rows start at pa, pb (this lane's first vector; items t ..
// t + MMV_UNROLL - 1; from t = 2 J on, the next pair's first items, from na) into r; nothing
// where that pair is not there.
__device__ __forceinline__ void pair_issue(u32x4 (&r)[MMV_UNROLL], const char* pa, const char* pb, const char* na,
                                           bool ok, bool next_ok, int t, int J, int step) {
    const i64 vs = (i64)step * 16;
    if (t >= 2 * J) {
        if (next_ok) ld_group(r, na + (t - 2 * J) * vs, vs);
    } else if (ok) {
        ld_group(r, (t < J ? pa + t * vs : pb + (t - J) * vs), vs);
    }
}

// The lane's partial dots (a, b) of pair p with x (16-byte aligned); cur holds p's first items on
// entry (pair_prefetch or the previous call) and the next pair's on return.
template <int WDT>
__device__ __forceinline__ void pair_dot(const RowPair& p, const RowPair& next, const float* x, int nvec, int v,
                                         int step, u32x4 (&cur)[MMV_UNROLL], float& a, float& b) {
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    const int J = pair_len(nvec, step), T = 2 * J;
    a = b = 0.0f;
    if (J * step == nvec && J % MMV_UNROLL == 0) {  // whole groups: no per-vector bounds checks or index math
        const char* pa = p.a + (i64)v * 16;
        const char* pb = p.b + (i64)v * 16;
        const char* na = next.a + (i64)v * 16;
        const float* xp = x + (i64)v * VEC;
        for (int t = 0; t < T; t += MMV_UNROLL) {
            u32x4 nxt[MMV_UNROLL];
            pair_issue(nxt, pa, pb, na, p.ok, next.ok, t + MMV_UNROLL, J, step);
            if (p.ok) pair_group<WDT>(cur, xp, step * VEC, t, J, a, b);
#pragma unroll
            for (int u = 0; u < MMV_UNROLL; ++u) cur[u] = nxt[u];
        }
        return;
    }
    for (int t0 = 0; t0 < T; t0 += MMV_UNROLL) {
        u32x4 nxt[MMV_UNROLL] = {};
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) {
            const int t = t0 + MMV_UNROLL + u;
            if (t < T) pair_load(p, J, nvec, v, step, t, nxt[u]);
            else pair_load(next, J, nvec, v, step, t - T, nxt[u]);
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) {
            const int t = t0 + u, idx = v + (t < J ? t : t - J) * step;
            if (p.ok && idx < nvec) {
                const float s = dot16<WDT>(cur[u], x + (i64)idx * VEC, 0.0f);
                if (t < J) a += s; else b += s;
            }
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; ++u) cur[u] = nxt[u];
    }
}

// The row-streaming loop for tall matrices: warp gw of W owns rows r = gw, gw + W, ... (at most
// rows_per_warp, W = warps in the grid, about one resident wave) and streams all their 16-byte
// vectors as one pipelined sequence of U in flight (item t = row t / J, vector lane + 32 * (t % J)),
// so loads stay in flight across row boundaries instead of every row paying a block's ramp and
// tail. issue_first() loads the first U (weights only: before the PDL wait); stream() consumes
// them against x (16-byte aligned, global or shared) and calls store(row, sum) on every lane with
// each row's warp-reduced dot.
template <int WDT>
__device__ __forceinline__ const char* w_row(const TV& w, int row) {
    return w.p + (w.n[0] * w.n[1] == 1 ? (i64)row * w.s[2] : tv_row_off(w, w.n, row));
}

template <int WDT, int U>
struct RowStream {
    static constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    const TV& w;
    int gw, W, lane, nvec, J, T;
    int ii = 0, jj = 0;  // issue side: next item to load
    u32x4 cur[U] = {};

    __device__ __forceinline__ RowStream(const TV& w_, int gw_, int W_, int rows_per_warp, int lane_)
        : w(w_), gw(gw_), W(W_), lane(lane_) {
        const int N = tv_rows(w);
        nvec = w.n[3] / VEC;
        J = (nvec + 31) / 32;
        int R = 0;  // rows of this warp
        while (R < rows_per_warp && gw + R * W < N) ++R;
        T = R * J;
    }

    __device__ __forceinline__ void issue(u32x4& slot) {
        const int v = lane + 32 * jj;
        if (v < nvec) slot = ld_stream(w_row<WDT>(w, gw + ii * W) + (i64)v * 16);
        if (++jj == J) { jj = 0; ++ii; }
    }

    __device__ __forceinline__ void issue_first() {
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (u < T) issue(cur[u]);
    }

    template <class Store>
    __device__ __forceinline__ void stream(const float* xr, float acc, Store store) {
        int ci = 0, cj = 0;  // consume side
        for (int t0 = 0; t0 < T; t0 += U) {
            u32x4 nxt[U] = {};
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (t0 + U + u < T) issue(nxt[u]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t0 + u < T) {
                    const int v = lane + 32 * cj;
                    if (v < nvec) acc = dot16<WDT>(cur[u], xr + (i64)v * VEC, acc);
                    if (++cj == J) {
                        store(gw + ci * W, warp_sum(acc));
                        acc = 0.0f;
                        cj = 0;
                        ++ci;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) cur[u] = nxt[u];
        }
    }
};

// The outputs a block of the row-streaming loop finishes together, stored as one write. Warp w of
// block b owns rows b * MMV_WARPS + w + i * W, so step i of a block's warps yields MMV_WARPS
// consecutive outputs. Each warp parks its value in shared memory; the warp that completes a step
// writes the step's 32 bytes as two 16-byte lanes, not 8 scattered 4-byte stores. Where the
// output is mapped host memory (--logits zero-copy) every store is a PCIe write, and a 4-byte
// write costs a whole transaction: with one store per row, llama-3.2-1b's lm_head ran 55 us longer
// (data/bench/kernels_s25_h200.md). Only for a flat f32 output whose steps start 16-byte
// aligned, with at most ROW_GROUP_STEPS rows a warp; otherwise a row at a time, as before.
#define ROW_GROUP_STEPS 64
struct alignas(16) RowGroups {
    float val[ROW_GROUP_STEPS][MMV_WARPS];
    int count[ROW_GROUP_STEPS];
};

// True (uniform over the grid) where `d` takes grouped stores: contiguous f32 rows of N outputs,
// 16-byte aligned at every step's first row.
__device__ __forceinline__ bool row_groups_ok(const TV& d, int N, int rows_per_warp) {
    const bool flat = d.dt == DT_F32 && d.s[3] == 4 && (d.n[2] == 1 || d.s[2] == (i64)d.n[3] * 4)
                      && (d.n[1] == 1 || d.s[1] == (i64)d.n[2] * d.n[3] * 4)
                      && (d.n[0] == 1 || d.s[0] == (i64)d.n[1] * d.n[2] * d.n[3] * 4);
    return flat && rows_per_warp <= ROW_GROUP_STEPS && N % 4 == 0 && ((unsigned long long)d.p & 15) == 0;
}

// Zero the step counters (before the block's barrier that precedes its first store).
__device__ __forceinline__ void row_groups_init(RowGroups& g) {
    for (int t = threadIdx.x; t < ROW_GROUP_STEPS; t += blockDim.x) g.count[t] = 0;
}

// Output `row` (= gw + i * W of warp `warp`, every lane holding v) of the N rows at `out`.
__device__ __forceinline__ void row_groups_store(RowGroups& g, float* out, int row, int gw, int W, int N, int warp,
                                                 int lane, float v) {
    const int i = (row - gw) / W, first = row - warp;
    const int n = min(MMV_WARPS, N - first);  // rows of this step (fewer only in the last)
    int c = 0;
    if (lane == 0) {
        g.val[i][warp] = v;
        __threadfence_block();
        c = atomicAdd(&g.count[i], 1);
    }
    if (__shfl_sync(0xffffffffu, c, 0) != n - 1) return;  // another warp completes the step
    __threadfence_block();  // the other warps' values (their fence preceded their count)
    if (n == MMV_WARPS) {
        if (lane < MMV_WARPS / 4) ((f32x4*)(out + first))[lane] = ((const f32x4*)g.val[i])[lane];
    } else if (lane < n) {
        out[first + lane] = g.val[i][lane];
    }
}
