// Row-wise ops: RMS_NORM (+ the fused RMS_NORM_MUL, RMS_NORM_MUL_ADD, RMS_NORM_MUL_Q8_1,
// RMS_NORM_MUL_ROPE), L2_NORM, NORM_GATED, SOFT_MAX, SUM_ROWS (+ the fused MUL_SUM_ROWS).
// One block per row (rows = the first three TV axes, the row on axis 3). Each thread stages its
// elements of the row (and of the weight / gate) in registers in one pass, so every read of the
// kernel happens before PDL_TRIGGER(after_main_loop): the next kernel may start while this one
// only computes and writes. Rows up to NORM_MAXPER * blockDim.x elements (8192 at 1024 threads).
#include "common.cuh"

#define NORM_RMS 0
#define NORM_RMS_MUL 1
#define NORM_L2 2
#define NORM_GATED_RMS 3
#define NORM_RMS_MUL_ADD 4
#define NORM_RMS_MUL_Q8_1 5
#define NORM_MAXPER 8

// x: rows to normalise; w: weight aligned to x's shape (broadcast strides); z: gate aligned to
// x's shape for NORM_GATED: rms_norm(x) * w * silu(z), or the addend for NORM_RMS_MUL_ADD:
// rms_norm(x) * w + z. d: rows aligned to x's shape; for NORM_RMS_MUL_Q8_1 (norm-mat-vec of
// quantised mat-vecs) q8_1 blocks of rms_norm(x) * w, each warp quantising the 32 values it holds
// at one step (blockDim.x and the row length are multiples of 32, so a step's warp holds a whole
// block): the q8_1 copy QUANTIZE_Q8_1 would have made of RMS_NORM_MUL's result, bit for bit.
template <int KIND>
__device__ __forceinline__ void norm_row(TV d, TV x, TV w, TV z, float eps) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int r = blockIdx.x, L = x.n[3], t = threadIdx.x, B = blockDim.x;
    const char* xr = x.p + tv_row_off(x, x.n, r);
    const bool has_w = KIND == NORM_RMS_MUL || KIND == NORM_GATED_RMS || KIND == NORM_RMS_MUL_ADD ||
                       KIND == NORM_RMS_MUL_Q8_1;
    const bool has_z = KIND == NORM_GATED_RMS || KIND == NORM_RMS_MUL_ADD;
    const char* wr = has_w ? w.p + tv_row_off(w, x.n, r) : 0;
    const char* zr = has_z ? z.p + tv_row_off(z, x.n, r) : 0;
    float xv[NORM_MAXPER], wv[NORM_MAXPER], zv[NORM_MAXPER];
    PDL_WAIT(first_read);
    const float first = t < L ? ldf_v(xr + (i64)t * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < NORM_MAXPER; ++u) {
        const int j = t + u * B;
        const bool in = j < L;
        xv[u] = u == 0 ? first : (in ? ldf(xr + (i64)j * x.s[3], x.dt) : 0.0f);
        wv[u] = (has_w && in) ? ldf(wr + (i64)j * w.s[3], w.dt) : 0.0f;
        zv[u] = (has_z && in) ? ldf(zr + (i64)j * z.s[3], z.dt) : 0.0f;
        ss += xv[u] * xv[u];
    }
    ss = block_sum(ss);
    PDL_TRIGGER(after_main_loop);
    float scale;
    if (KIND == NORM_L2) scale = 1.0f / fmaxf(sqrtf(ss), eps);  // ggml_l2_norm: x / max(||x||, eps)
    else scale = 1.0f / sqrtf(ss / (float)L + eps);
    char* dr = d.p + tv_row_off(d, x.n, r);
#pragma unroll
    for (int u = 0; u < NORM_MAXPER; ++u) {
        const int j = t + u * B;
        if (KIND == NORM_RMS_MUL_Q8_1) {
            if (j < L) warp_store_q8_1(dr + (i64)(j / 32) * d.s[3], xv[u] * scale * wv[u], j % 32);
        } else if (j < L) {
            float v = xv[u] * scale;
            if (has_w) v *= wv[u];
            if (KIND == NORM_GATED_RMS) v *= silu_f(zv[u]);
            if (KIND == NORM_RMS_MUL_ADD) v += zv[u];
            stf(dr + (i64)j * d.s[3], d.dt, v);
        }
    }
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_rms_norm(TV d, TV x, float eps) { norm_row<NORM_RMS>(d, x, x, x, eps); }
extern "C" __global__ void k_rms_norm_mul(TV d, TV x, TV w, float eps) { norm_row<NORM_RMS_MUL>(d, x, w, x, eps); }
extern "C" __global__ void k_rms_norm_mul_add(TV d, TV x, TV w, TV y, float eps) {
    norm_row<NORM_RMS_MUL_ADD>(d, x, w, y, eps);
}
extern "C" __global__ void k_rms_norm_mul_q8_1(TV d, TV x, TV w, float eps) {
    norm_row<NORM_RMS_MUL_Q8_1>(d, x, w, x, eps);
}
extern "C" __global__ void k_l2_norm(TV d, TV x, float eps) { norm_row<NORM_L2>(d, x, x, x, eps); }
extern "C" __global__ void k_norm_gated(TV d, TV x, TV w, TV z, float eps) {
    norm_row<NORM_GATED_RMS>(d, x, w, z, eps);
}

// RMS_NORM_MUL_ROPE (rms-norm-mul-rope, ggml's rms_norm_mul_rope_f32): each row (a head of
// Qwen3's Q or K) normalised, times w, rotated as k_rope rotates (NeoX halves of the first n_rot
// elements), written aligned to x's shape or, when `store`, into cache row idx[i / R] as
// k_rope_set_rows stores (R = one cache row's elements, cache rows_first). As llama.cpp's: a block
// per row and a thread per rotated pair (t, t + n_rot / 2), or per pair of the unrotated tail
// (2 t', 2 t' + 1 after n_rot), so no thread runs a loop: blockDim = hd / 2 rounded up to a warp.
// The earlier warp-per-row kernel (each lane rotating 4 elements in turn) took 4.8 us per launch
// on an H100 against llama.cpp's 2.2-2.3 us (data/bench/fusion_kernels_h100.md); its first version
// (the rotation unrolled) was 92 KB of code, which a kernel that a few warps run once fetches
// cold. The float32 steps are k_rms_norm_mul's and k_rope's, in their order.
extern "C" __global__ void k_rms_norm_mul_rope(TV d, TV x, TV w, TV pos, TV freqs, TV idx, float eps, int n_rot,
                                               float attn_factor, int store) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int r = blockIdx.x, t = threadIdx.x, hd = x.n[3], half = n_rot / 2;
    const bool live = 2 * t < hd, rot = t < half;
    const int e0 = rot ? t : n_rot + 2 * (t - half), e1 = rot ? t + half : e0 + 1;
    const char* xr = x.p + tv_row_off(x, x.n, r);
    // constants first (plain f32 loads: the binder checks the dtypes)
    const float* wf = (const float*)w.p;
    const int ws = (int)(w.s[3] / 4), xs = (int)(x.s[3] / 4);
    const float w0 = live ? wf[e0 * ws] : 0.0f, w1 = live ? wf[e1 * ws] : 0.0f;
    const float inv = live && rot ? ((const float*)freqs.p)[t * (int)(freqs.s[3] / 4)] : 0.0f;
    PDL_WAIT(first_read);
    const float x0 = live ? ldf_v(xr + (i64)e0 * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    const float x1 = live ? ((const float*)xr)[e1 * xs] : 0.0f;
    const float p = (float)ldi(pos.p, pos.dt);
    const bool one_row = tv_numel(idx) == 1;
    const i64 row0 = store && one_row ? ldi(idx.p, idx.dt) * d.s[0] : 0;
    PDL_TRIGGER(after_main_loop);
    const float ss = block_sum(x0 * x0 + x1 * x1);
    if (!live) return;
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    float v0 = x0 * scale, v1 = x1 * scale;
    v0 *= w0;
    v1 *= w1;
    if (rot) {
        float sn, c;
        sincosf(p * inv, &sn, &c);
        c *= attn_factor;
        sn *= attn_factor;
        const float o0 = v0 * c - v1 * sn, o1 = v1 * c + v0 * sn;
        v0 = o0;
        v1 = o1;
    }
    char *q0, *q1;
    if (store) {
        const int R = d.n[1] * d.n[2] * d.n[3], i0 = r * hd + e0, i1 = r * hd + e1;
        const int cshape[4] = {1, d.n[1], d.n[2], d.n[3]};
        // the multi-row index is read here, after the trigger: it is an input
        q0 = d.p + (one_row ? row0 : ldi(idx.p + tv_off(idx, idx.n, i0 / R), idx.dt) * d.s[0]) + tv_off(d, cshape, i0 % R);
        q1 = d.p + (one_row ? row0 : ldi(idx.p + tv_off(idx, idx.n, i1 / R), idx.dt) * d.s[0]) + tv_off(d, cshape, i1 % R);
    } else {
        char* drow = d.p + tv_row_off(d, x.n, r);
        q0 = drow + (i64)e0 * d.s[3];
        q1 = drow + (i64)e1 * d.s[3];
    }
    if (d.dt == DT_F16) {
        *(u16*)q0 = f2h(v0);
        *(u16*)q1 = f2h(v1);
    } else if (d.dt == DT_BF16) {
        *(u16*)q0 = f2bf(v0);
        *(u16*)q1 = f2bf(v1);
    } else {
        *(float*)q0 = v0;
        *(float*)q1 = v1;
    }
    PDL_TRIGGER(end);
}

// SOFT_MAX over the last axis: exp(x - max) / sum. d: rows aligned to x's shape.
extern "C" __global__ void k_soft_max(TV d, TV x) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int r = blockIdx.x, L = x.n[3], t = threadIdx.x, B = blockDim.x;
    const char* xr = x.p + tv_row_off(x, x.n, r);
    float xv[NORM_MAXPER];
    PDL_WAIT(first_read);
    const float first = t < L ? ldf_v(xr + (i64)t * x.s[3], x.dt) : -WB_INF;
    PDL_WAIT(late);
    float m = -WB_INF;
#pragma unroll
    for (int u = 0; u < NORM_MAXPER; ++u) {
        const int j = t + u * B;
        xv[u] = u == 0 ? first : (j < L ? ldf(xr + (i64)j * x.s[3], x.dt) : -WB_INF);
        m = fmaxf(m, xv[u]);
    }
    PDL_TRIGGER(after_main_loop);
    m = block_max(m);
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < NORM_MAXPER; ++u) {
        xv[u] = t + u * B < L ? expf(xv[u] - m) : 0.0f;
        s += xv[u];
    }
    s = block_sum(s);
    char* dr = d.p + tv_row_off(d, x.n, r);
#pragma unroll
    for (int u = 0; u < NORM_MAXPER; ++u) {
        const int j = t + u * B;
        if (j < L) stf(dr + (i64)j * d.s[3], d.dt, xv[u] / s);
    }
    PDL_TRIGGER(end);
}

// SUM_ROWS: d[r] = sum_j x[r, j]; d unravelled flat over its own shape.
extern "C" __global__ void k_sum_rows(TV d, TV x) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int r = blockIdx.x, L = x.n[3], t = threadIdx.x;
    const char* xr = x.p + tv_row_off(x, x.n, r);
    PDL_WAIT(first_read);
    const float first = t < L ? ldf_v(xr + (i64)t * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    float s = 0.0f;
    for (int j = t; j < L; j += blockDim.x) s += j == t ? first : ldf(xr + (i64)j * x.s[3], x.dt);
    PDL_TRIGGER(after_main_loop);
    s = block_sum(s);
    if (t == 0) stf(d.p + tv_off(d, d.n, r), d.dt, s);
    PDL_TRIGGER(end);
}

// MUL_SUM_ROWS (moe-weighted-reduction, ggml's moe_weighted_reduction): d[j] = sum over the k
// experts of e[q, j] * w[q], each product rounded as MUL rounds it, summed in expert order. A
// thread per output element; e: [k, n] (axes 2..3), w: one weight per expert (axis 2), d: flat [n].
extern "C" __global__ void k_sum_rows_mul(TV d, TV e, TV w) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int j = blockIdx.x * blockDim.x + threadIdx.x, K = e.n[2], n = e.n[3];
    const bool ok = j < n;
    const char* ej = e.p + (i64)(ok ? j : 0) * e.s[3];
    PDL_WAIT(first_read);
    const float first = ok ? ldf_v(ej, e.dt) : 0.0f;
    PDL_WAIT(late);
    float s = 0.0f;
    for (int q = 0; q < K; ++q) {
        const float ev = q == 0 ? first : (ok ? ldf(ej + (i64)q * e.s[2], e.dt) : 0.0f);
        s += __fmul_rn(ev, ldf(w.p + (i64)q * w.s[2], w.dt));
    }
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + tv_off(d, d.n, j), d.dt, s);
    PDL_TRIGGER(end);
}
