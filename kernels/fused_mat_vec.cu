// The workbench's own fused mat-vecs (strategy/fusion_ours.py; llama.cpp has no kernel for them):
//
// * RMS_NORM_MUL_MAT, RMS_NORM_MUL_MAT_GLU (norm-mat-vec; tall matrices through the row-streaming
//   loop, k_mul_mat_vec_rows_*_norm): the RMS norm of the activation folded
//   into the mat-vec that reads it. Every block stages x * w_norm in shared memory while it sums
//   x^2 (x is K floats the mat-vec reads anyway), then streams its weight rows against the staged
//   row; a row's dot is scaled by rsqrt(mean(x^2) + eps) at the end (rms_norm(x) * w . row =
//   scale * (x * w) . row). The norm kernel disappears.
// * QKV_ROPE_SET_ROWS (qkv-rope-store, + the norm when norm-mat-vec is on): a layer's Q, K and V
//   mat-vecs as one grid over the rows of the three weights, in rotation pairs: a warp group
//   computes rows j and j + n_rot/2 of a head (NeoX halves, as kernels/rope.cu), or two
//   consecutive unrotated rows (the head's dims past n_rot, and V), rotates q and k in its
//   epilogue (after adding each row's bias, gpt-oss's biased projections) and stores q to its
//   output and k / v straight into their cache rows idx[0].
//
// Work split as the block mat-vec (mul_mat.cu): MMV_WARPS warps, `splits` warps per row (pair)
// interleaving over K, reduced through shared memory in a fixed order. The grid is at most about
// one resident wave; blocks stride over the rows, so the staging prologue is paid once per block.
// PDL: the first weight vectors are loaded before PDL_WAIT(first_read); x, w_norm, pos, idx and
// the frequencies are read after it, all before PDL_TRIGGER(after_main_loop), which follows the
// last round (the stores are in the rounds: writes span to the kernel's end anyway).
#include "mat_vec.cuh"

// activation elements staged per block (strategy/fusion_ours.py FUSED_MAX_K)
#define FMV_MAXK 8192
// resident blocks per SM the kernels are compiled for (<= 64 registers per thread; 33 KB of shared
// memory each): the grid is at most that many blocks per SM (cuda_ops FMV_MAX_BLOCKS)
#define FMV_MIN_BLOCKS 4

// Stage x (one contiguous, 16-byte aligned f32 row of K, K a multiple of 4) in xs, times w_norm
// when `norm`, as float4 loads (independent of each other: one round trip); returns the norm's
// scale rsqrt(mean(x^2) + eps), 1 without it. x0: x[0], already read (the first dependent read).
__device__ __forceinline__ float stage_x(const TV& x, const TV& nw, bool norm, float eps, int K, float x0, float* xs) {
    const f32x4* xr = (const f32x4*)x.p;
    const f32x4* wr = (const f32x4*)nw.p;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < K / 4; k += blockDim.x) {
        f32x4 v = xr[k];
        if (k == 0) v.x = x0;
        ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
        if (norm) {
            const f32x4 w = wr[k];
            v.x *= w.x; v.y *= w.y; v.z *= w.z; v.w *= w.w;
        }
        ((f32x4*)xs)[k] = v;
    }
    __syncthreads();
    if (!norm) return 1.0f;
    return rsqrtf(block_sum(ss) / (float)K + eps);
}

// Sum a value per row over the `splits` warps of the row (after the warp sums); the result is
// valid in lane 0 of the row's first warp. Two barriers: the next round reuses `partial`.
__device__ __forceinline__ void reduce_pair(float& a, float& b, int splits) {
    __shared__ float partial[2][MMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    a = warp_sum(a);
    b = warp_sum(b);
    if (splits > 1) {
        if (lane == 0) { partial[0][warp] = a; partial[1][warp] = b; }
        __syncthreads();
        if (lane == 0 && part == 0)
            for (int p = 1; p < splits; ++p) { a += partial[0][warp + p]; b += partial[1][warp + p]; }
        __syncthreads();
    }
}

// Row `row` of the gate and the up weights (a GLU's pair; no loads past N).
__device__ __forceinline__ RowPair glu_pair(const TV& w, const TV& wu, int row, int N) {
    const int r = row < N ? row : 0;
    return {w.p + tv_row_off(w, w.n, r), wu.p + tv_row_off(wu, wu.n, r), row < N};
}

// RMS_NORM_MUL_MAT (GLU false: d = scale * (w @ (x * w_norm))) and RMS_NORM_MUL_MAT_GLU (GLU:
// d = silu(scale * gate) * (scale * up)); w (and wu) rows on TV axes 0..2 as in k_mul_mat_vec_*.
// grid = (blocks,), rows blockIdx.x * R + r * gridDim.x * R, R = MMV_WARPS / splits.
template <int WDT, bool GLU>
__device__ __forceinline__ void fmv_norm(TV d, TV w, TV wu, TV x, TV nw, float eps, int splits) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    __shared__ f32x4 xs4[FMV_MAXK / 4];  // the staged row, 16-byte aligned (f32x4 is alignas(16))
    float* xs = (float*)xs4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    const int R = MMV_WARPS / splits, stride = gridDim.x * R;
    const int N = tv_rows(w), K = w.n[3], nvec = K / VEC, step = 32 * splits, v = part * 32 + lane;
    int row = blockIdx.x * R + warp / splits;
    u32x4 cur[MMV_UNROLL] = {};
    if (GLU) pair_prefetch(glu_pair(w, wu, row, N), nvec, v, step, cur);  // weights
    else prefetch(w.p + tv_row_off(w, w.n, row < N ? row : 0), nvec, v, step, row < N, cur);
    PDL_WAIT(first_read);
    const float x0 = ldf_v(x.p, DT_F32);
    PDL_WAIT(late);
    const float scale = stage_x(x, nw, true, eps, K, x0, xs);
    for (int base = blockIdx.x * R; base < N; base += stride, row += stride) {
        const bool valid = row < N;
        const int nxt = row + stride;  // the next round's first vectors are in flight over the reduction
        float g, u = 0.0f;
        if (GLU) {
            pair_dot<WDT>(glu_pair(w, wu, row, N), glu_pair(w, wu, nxt, N), xs, nvec, v, step, cur, g, u);
        } else {
            g = valid ? row_dot<WDT>(w.p + tv_row_off(w, w.n, row), xs, nvec, v, step, cur) : 0.0f;
            prefetch(w.p + tv_row_off(w, w.n, nxt < N ? nxt : 0), nvec, v, step, nxt < N, cur);
        }
        reduce_pair(g, u, splits);
        if (valid && lane == 0 && part == 0)
            stf(d.p + tv_off(d, d.n, row), d.dt, GLU ? silu_f(scale * g) * (scale * u) : scale * g);
    }
    PDL_TRIGGER(after_main_loop);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f16_norm(TV d, TV w, TV x, TV nw, float eps,
                                                                         int splits) {
    fmv_norm<DT_F16, false>(d, w, w, x, nw, eps, splits);
}
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_bf16_norm(TV d, TV w, TV x, TV nw, float eps,
                                                                          int splits) {
    fmv_norm<DT_BF16, false>(d, w, w, x, nw, eps, splits);
}
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f32_norm(TV d, TV w, TV x, TV nw, float eps,
                                                                         int splits) {
    fmv_norm<DT_F32, false>(d, w, w, x, nw, eps, splits);
}
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f16_glu_norm(TV d, TV wg, TV wu, TV x, TV nw,
                                                                             float eps, int splits) {
    fmv_norm<DT_F16, true>(d, wg, wu, x, nw, eps, splits);
}
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_bf16_glu_norm(TV d, TV wg, TV wu, TV x, TV nw,
                                                                              float eps, int splits) {
    fmv_norm<DT_BF16, true>(d, wg, wu, x, nw, eps, splits);
}
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f32_glu_norm(TV d, TV wg, TV wu, TV x, TV nw,
                                                                             float eps, int splits) {
    fmv_norm<DT_F32, true>(d, wg, wu, x, nw, eps, splits);
}

// RMS_NORM_MUL_MAT for tall matrices (N >= 8192: the lm_head): the row-streaming loop of
// k_mul_mat_vec_rows_* (RowStream) over the staged x * w_norm, each row's dot scaled in its store.
// grid = (ceil(ceil(N / rows_per_warp) / MMV_WARPS),). U loads in flight a lane: MMV_ROWS_UNROLL,
// or MMV_HEAD_UNROLL in the _deep_ kernels (cuda_ops.HEAD_DEEP_RING: faster for some lm_heads in
// whole decode steps, slower for others).
template <int WDT, int U>
__device__ __forceinline__ void fmv_rows_norm(TV d, TV w, TV x, TV nw, float eps, int rows_per_warp) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ f32x4 xs4[FMV_MAXK / 4];  // the staged row, 16-byte aligned (f32x4 is alignas(16))
    float* xs = (float*)xs4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * MMV_WARPS + warp, W = gridDim.x * MMV_WARPS, N = tv_rows(w);
    RowStream<WDT, U> rs(w, gw, W, rows_per_warp, lane);
    rs.issue_first();  // weights: independent of earlier kernels
    __shared__ RowGroups groups;
    const bool grouped = row_groups_ok(d, N, rows_per_warp);
    if (grouped) row_groups_init(groups);  // stage_x's barrier publishes it
    PDL_WAIT(first_read);
    const float x0 = ldf_v(x.p, DT_F32);
    PDL_WAIT(late);
    const float scale = stage_x(x, nw, true, eps, w.n[3], x0, xs);
    rs.stream(xs, 0.0f, [&](int row, float sum) {
        if (grouped) row_groups_store(groups, (float*)d.p, row, gw, W, N, warp, lane, scale * sum);
        else if (lane == 0) stf(d.p + tv_off(d, d.n, row), d.dt, scale * sum);
    });
    PDL_TRIGGER(after_main_loop);
    PDL_TRIGGER(end);
}

#define FMV_ROWS_NORM_KERNEL(NAME, WDT, U)                                                                \
    extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) NAME(TV d, TV w, TV x, TV nw, float eps, \
                                                                            int rpw) {                    \
        fmv_rows_norm<WDT, U>(d, w, x, nw, eps, rpw);                                                     \
    }
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_f16_norm, DT_F16, MMV_ROWS_UNROLL)
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_bf16_norm, DT_BF16, MMV_ROWS_UNROLL)
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_f32_norm, DT_F32, MMV_ROWS_UNROLL)
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_deep_f16_norm, DT_F16, MMV_HEAD_UNROLL)
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_deep_bf16_norm, DT_BF16, MMV_HEAD_UNROLL)
FMV_ROWS_NORM_KERNEL(k_mul_mat_vec_rows_deep_f32_norm, DT_F32, MMV_HEAD_UNROLL)

// The two weight rows of rotation pair `item` (of (Nq + Nk + Nv) / 2, heads of hd rows: Q's,
// then K's, then V's): which = 0 q, 1 k, 2 v; ra, rb rows within the head; rot: a NeoX pair
// (ra = j, rb = j + n_rot / 2, frequency index j), else two consecutive unrotated rows.
struct QkvPair {
    int which, head, ra, rb, fi;
    bool rot;
};

__device__ __forceinline__ QkvPair qkv_pair(int item, int hd, int n_rot, int hq, int hk) {
    QkvPair p;
    const int per = hd / 2, half = n_rot / 2;
    int h = item / per;
    const int j = item % per;
    p.which = h < hq ? 0 : (h < hq + hk ? 1 : 2);
    p.head = p.which == 0 ? h : (p.which == 1 ? h - hq : h - hq - hk);
    p.rot = p.which < 2 && j < half;
    p.fi = j;
    if (p.rot) { p.ra = j; p.rb = j + half; }
    else if (p.which < 2) { p.ra = n_rot + 2 * (j - half); p.rb = p.ra + 1; }
    else { p.ra = 2 * j; p.rb = p.ra + 1; }
    return p;
}

__device__ __forceinline__ const char* qkv_row(const TV& wq, const TV& wk, const TV& wv, const QkvPair& p, int hd,
                                               int r) {
    const int row = p.head * hd + r;  // branches, not a reference to a chosen TV: that spills the views to the stack
    if (p.which == 0) return wq.p + tv_row_off(wq, wq.n, row);
    if (p.which == 1) return wk.p + tv_row_off(wk, wk.n, row);
    return wv.p + tv_row_off(wv, wv.n, row);
}

// The weight rows of rotation pair `item` (none past P).
__device__ __forceinline__ RowPair qkv_rows(const TV& wq, const TV& wk, const TV& wv, int item, int P, int hd,
                                            int n_rot, int hq, int hk) {
    const QkvPair p = qkv_pair(item < P ? item : 0, hd, n_rot, hq, hk);
    return {qkv_row(wq, wk, wv, p, hd, p.ra), qkv_row(wq, wk, wv, p, hd, p.rb), item < P};
}

// Element e of a cache row (row axis on TV axis 0, the row's elements on axes 1..3: rows_first).
__device__ __forceinline__ char* cache_elem(const TV& c, i64 row, int e) {
    const int shape[4] = {1, c.n[1], c.n[2], c.n[3]};
    return c.p + row * c.s[0] + tv_off(c, shape, e);
}

// QKV_ROPE_SET_ROWS: q [Hq, hd] (rotated), kc / vc caches (rows_first) at row idx[0]; wq, wk, wv
// rows on TV axes 0..2 (Nq, Nk = Nv rows of K); freqs [n_rot / 2]; has_norm: x normed with w_norm;
// has_bias: bq, bk, bv (one f32 per row, flat) added before the rotation.
// grid = (blocks,), pairs blockIdx.x * R + r * gridDim.x * R, R = MMV_WARPS / splits.
template <int WDT>
__device__ __forceinline__ void fmv_qkv(TV q, TV kc, TV vc, TV wq, TV wk, TV wv, TV x, TV pos, TV freqs, TV idx,
                                        TV nw, TV bq, TV bk, TV bv, int n_rot, float attn_factor, float eps,
                                        int has_norm, int has_bias, int splits) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    __shared__ f32x4 xs4[FMV_MAXK / 4];  // the staged row, 16-byte aligned (f32x4 is alignas(16))
    float* xs = (float*)xs4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    const int hd = q.n[3], hq = tv_rows(wq) / hd, hk = tv_rows(wk) / hd, hv = tv_rows(wv) / hd;
    const int P = (hq + hk + hv) * (hd / 2);
    const int R = MMV_WARPS / splits, stride = gridDim.x * R;
    const int K = wq.n[3], nvec = K / VEC, step = 32 * splits, v = part * 32 + lane;
    int item = blockIdx.x * R + warp / splits;
    u32x4 cur[MMV_UNROLL] = {};
    pair_prefetch(qkv_rows(wq, wk, wv, item, P, hd, n_rot, hq, hk), nvec, v, step, cur);  // weights
    PDL_WAIT(first_read);
    const float x0 = ldf_v(x.p, DT_F32);
    PDL_WAIT(late);
    const float scale = stage_x(x, nw, has_norm, eps, K, x0, xs);
    const float pf = (float)ldi(pos.p, pos.dt);
    const i64 crow = ldi(idx.p, idx.dt);
    for (int base = blockIdx.x * R; base < P; base += stride, item += stride) {
        const bool valid = item < P;
        const QkvPair p = qkv_pair(valid ? item : 0, hd, n_rot, hq, hk);
        float a, b;  // the next round's first vectors are in flight over the epilogue
        pair_dot<WDT>(qkv_rows(wq, wk, wv, item, P, hd, n_rot, hq, hk),
                      qkv_rows(wq, wk, wv, item + stride, P, hd, n_rot, hq, hk), xs, nvec, v, step, cur, a, b);
        reduce_pair(a, b, splits);
        if (valid && lane == 0 && part == 0) {
            a *= scale;
            b *= scale;
            if (has_bias) {
                const int ra = p.head * hd + p.ra, rb = p.head * hd + p.rb;
                if (p.which == 0) { a += ldf(bq.p + (i64)ra * bq.s[3], bq.dt); b += ldf(bq.p + (i64)rb * bq.s[3], bq.dt); }
                else if (p.which == 1) { a += ldf(bk.p + (i64)ra * bk.s[3], bk.dt); b += ldf(bk.p + (i64)rb * bk.s[3], bk.dt); }
                else { a += ldf(bv.p + (i64)ra * bv.s[3], bv.dt); b += ldf(bv.p + (i64)rb * bv.s[3], bv.dt); }
            }
            if (p.rot) {
                const float ang = pf * ldf(freqs.p + (i64)p.fi * freqs.s[3], freqs.dt);
                const float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
                const float ra = a * c - b * s, rb = b * c + a * s;
                a = ra;
                b = rb;
            }
            const int ea = p.head * hd + p.ra, eb = p.head * hd + p.rb;
            if (p.which == 0) {
                stf(q.p + tv_off(q, q.n, ea), q.dt, a);
                stf(q.p + tv_off(q, q.n, eb), q.dt, b);
            } else if (p.which == 1) {
                stf(cache_elem(kc, crow, ea), kc.dt, a);
                stf(cache_elem(kc, crow, eb), kc.dt, b);
            } else {
                stf(cache_elem(vc, crow, ea), vc.dt, a);
                stf(cache_elem(vc, crow, eb), vc.dt, b);
            }
        }
    }
    PDL_TRIGGER(after_main_loop);
    PDL_TRIGGER(end);
}

#define QKV_ARGS TV q, TV kc, TV vc, TV wq, TV wk, TV wv, TV x, TV pos, TV freqs, TV idx, TV nw, TV bq, TV bk, \
    TV bv, int n_rot, float attn_factor, float eps, int has_norm, int has_bias, int splits
#define QKV_CALL(WDT) fmv_qkv<WDT>(q, kc, vc, wq, wk, wv, x, pos, freqs, idx, nw, bq, bk, bv, n_rot, attn_factor, \
                                   eps, has_norm, has_bias, splits)

extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f16_qkv_rope(QKV_ARGS) { QKV_CALL(DT_F16); }
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_bf16_qkv_rope(QKV_ARGS) { QKV_CALL(DT_BF16); }
extern "C" __global__ void __launch_bounds__(256, FMV_MIN_BLOCKS) k_mul_mat_vec_f32_qkv_rope(QKV_ARGS) { QKV_CALL(DT_F32); }
