// MUL_MAT and MUL_MAT_ID for a decode step: mat-vec of f16 / bf16 / f32 weights with an f32
// activation, fp32 accumulation. This is the hot path (a decode step is mostly these kernels
// streaming weights), so the vector kernels use 16-byte non-caching loads of the weights, coalesced
// across the warp, and keep 2 x MMV_UNROLL loads per lane in flight (software pipelined): with 8
// warps per block and several blocks per SM that is >= 64 KB in flight per SM, above the ~25 KB a
// Hopper SM needs to cover memory latency at full bandwidth.
//
// Work split: a block of MMV_WARPS warps covers MMV_WARPS / splits rows; the `splits` warps of a
// row interleave over K and are reduced through shared memory in a fixed order (deterministic
// results, so graph replays are bit-identical). The host picks splits so that small-N
// projections (K/V) still put enough warps on the GPU.
//
// PDL: weights never change during a step, so the first loads of the weight row are issued
// before PDL_WAIT(first_read); the activation is read after it.
#include "mat_vec.cuh"

// Reduce the row's partial sums (lanes, then the `splits` warps of the row) and store, plus
// `addend` (the mul-mat-add fusion's bias / residual element, read before the trigger).
__device__ __forceinline__ void finish(float acc, int splits, TV& d, i64 out_index, bool valid,
                                       bool has_addend = false, float addend = 0.0f) {
    __shared__ float partial[MMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    acc = warp_sum(acc);
    if (splits > 1) {
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (lane == 0 && part == 0)
            for (int p = 1; p < splits; ++p) acc += partial[warp + p];
    }
    if (valid && lane == 0 && part == 0) stf(d.p + tv_off(d, d.n, (int)out_index), d.dt, has_addend ? acc + addend : acc);
}

// d = x @ w.T: w rows on TV axes 0..2 (N = their product: an N-d weight view such as rows picked
// out of a fused tensor flattens to [N, K] in C order), K on axis 3 with inner stride = itemsize;
// x rows on axes 0..2 (f32, contiguous rows of K); d unravelled flat as [M, N].
// grid = (ceil(N / (MMV_WARPS / splits)), M).
// ADD (the mul-mat-add fusion): d = x @ w.T + b, b aligned to d's shape (same flat index).
template <int WDT, bool ADD>
__device__ __forceinline__ void mmv(TV d, TV w, TV x, int splits, TV b) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * (MMV_WARPS / splits) + warp / splits;
    const int m = blockIdx.y, N = tv_rows(w), K = w.n[3], nvec = K / VEC, step = 32 * splits;
    const int v = (warp % splits) * 32 + lane;
    const bool valid = row < N;
    const char* wr = w.p + tv_row_off(w, w.n, valid ? row : 0);
    u32x4 cur[MMV_UNROLL] = {};
    prefetch(wr, nvec, v, step, valid, cur);  // weights: independent of earlier kernels
    PDL_WAIT(first_read);
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, m));
    const float x0 = ldf_v((const char*)xr, DT_F32);
    PDL_WAIT(late);
    float acc = valid ? row_dot<WDT>(wr, xr, nvec, v, step, cur) : 0.0f;
    acc += 0.0f * x0;
    const float addend = (ADD && valid) ? ldf(b.p + tv_off(b, b.n, m * N + row), b.dt) : 0.0f;
    PDL_TRIGGER(after_main_loop);
    finish(acc, splits, d, (i64)m * N + row, valid, ADD, addend);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f16(TV d, TV w, TV x, int splits) {
    mmv<DT_F16, false>(d, w, x, splits, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f16_add(TV d, TV w, TV x, int splits, TV b) {
    mmv<DT_F16, true>(d, w, x, splits, b);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_bf16(TV d, TV w, TV x, int splits) {
    mmv<DT_BF16, false>(d, w, x, splits, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_bf16_add(TV d, TV w, TV x, int splits, TV b) {
    mmv<DT_BF16, true>(d, w, x, splits, b);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f32(TV d, TV w, TV x, int splits) {
    mmv<DT_F32, false>(d, w, x, splits, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f32_add(TV d, TV w, TV x, int splits, TV b) {
    mmv<DT_F32, true>(d, w, x, splits, b);
}

// Row-streaming variant for tall matrices (N >= 8192: FFN gate/up, lm_head): RowStream
// (mat_vec.cuh), about one resident wave of warps, each streaming all its rows' vectors
// as one pipelined sequence. grid = (ceil(ceil(N / rows_per_warp) / MMV_WARPS), M).
template <int WDT, int U, bool ADD>
__device__ __forceinline__ void mmv_rows(TV d, TV w, TV x, int rows_per_warp, TV b) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m = blockIdx.y, N = tv_rows(w);
    const int gw = blockIdx.x * MMV_WARPS + warp, W = gridDim.x * MMV_WARPS;
    RowStream<WDT, U> rs(w, gw, W, rows_per_warp, lane);
    rs.issue_first();  // weights: independent of earlier kernels
    __shared__ RowGroups groups;
    const bool grouped = row_groups_ok(d, N, rows_per_warp);
    if (grouped) {
        row_groups_init(groups);
        __syncthreads();
    }
    PDL_WAIT(first_read);
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, m));
    const float x0 = ldf_v((const char*)xr, DT_F32);
    PDL_WAIT(late);
    rs.stream(xr, 0.0f * x0, [&](int row, float sum) {
        const int o = m * N + row;
        const float v = ADD ? sum + ldf(b.p + tv_off(b, b.n, o), b.dt) : sum;
        if (grouped) row_groups_store(groups, (float*)d.p + (i64)m * N, row, gw, W, N, warp, lane, v);
        else if (lane == 0) stf(d.p + tv_off(d, d.n, o), d.dt, v);
    });
    PDL_TRIGGER(after_main_loop);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_f16(TV d, TV w, TV x, int rows_per_warp) {
    mmv_rows<DT_F16, MMV_ROWS_UNROLL, false>(d, w, x, rows_per_warp, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_f16_add(TV d, TV w, TV x, int rows_per_warp,
                                                                            TV b) {
    mmv_rows<DT_F16, MMV_ROWS_UNROLL, true>(d, w, x, rows_per_warp, b);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_bf16(TV d, TV w, TV x, int rows_per_warp) {
    mmv_rows<DT_BF16, MMV_ROWS_UNROLL, false>(d, w, x, rows_per_warp, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_bf16_add(TV d, TV w, TV x, int rows_per_warp,
                                                                            TV b) {
    mmv_rows<DT_BF16, MMV_ROWS_UNROLL, true>(d, w, x, rows_per_warp, b);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_f32(TV d, TV w, TV x, int rows_per_warp) {
    mmv_rows<DT_F32, MMV_ROWS_UNROLL, false>(d, w, x, rows_per_warp, d);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_rows_f32_add(TV d, TV w, TV x, int rows_per_warp,
                                                                            TV b) {
    mmv_rows<DT_F32, MMV_ROWS_UNROLL, true>(d, w, x, rows_per_warp, b);
}

// MUL_MAT_ID: d[i] = w[ids[i]] @ x[i or 0]: w [E, N, K] on TV axes 1..3, ids on axis 3, d flat
// [n_ids, N]. grid = (ceil(N / rows per block), n_ids). The expert is known only after reading
// ids (written by the router's top-k), so no weight prefetch before the wait.
template <int WDT>
__device__ __forceinline__ void mmv_id(TV d, TV w, TV x, TV ids, int splits) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * (MMV_WARPS / splits) + warp / splits;
    const int slot = blockIdx.y, N = w.n[2], K = w.n[3], nvec = K / VEC, step = 32 * splits;
    const int v = (warp % splits) * 32 + lane;
    const bool valid = row < N;
    const int xrows = tv_rows(x);
    PDL_WAIT(first_read);
    const i64 e = ldi_v(ids.p + tv_off(ids, ids.n, slot), ids.dt);
    PDL_WAIT(late);
    const char* wr = w.p + e * w.s[1] + (i64)(valid ? row : 0) * w.s[2];
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, xrows > 1 ? slot : 0));
    u32x4 cur[MMV_UNROLL] = {};
    prefetch(wr, nvec, v, step, valid, cur);
    float acc = valid ? row_dot<WDT>(wr, xr, nvec, v, step, cur) : 0.0f;
    PDL_TRIGGER(after_main_loop);
    finish(acc, splits, d, (i64)slot * N + row, valid);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_f16(TV d, TV w, TV x, TV ids, int splits) {
    mmv_id<DT_F16>(d, w, x, ids, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_bf16(TV d, TV w, TV x, TV ids, int splits) {
    mmv_id<DT_BF16>(d, w, x, ids, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_f32(TV d, TV w, TV x, TV ids, int splits) {
    mmv_id<DT_F32>(d, w, x, ids, splits);
}

// Segmented variant for short rows (K of a few thousand that is not a multiple of 32 vectors:
// gpt-oss's K = 2880 is 360 16-byte vectors, 11.25 per lane of a whole warp): `lpr` lanes per
// row (8 or 16), so a warp covers 32 / lpr rows and each lane streams about nvec / lpr vectors
// through the same pipelined row_dot, fewer lanes idling in the last round; a row's sums are
// reduced over its lane segment by shuffles. ID: MUL_MAT_ID (w [E, N, K] on axes 1..3, the
// expert read from ids after the wait, no weight prefetch before it), else MUL_MAT (w rows on
// axes 0..2, prefetched before the wait). grid = (ceil(N / (MMV_WARPS * 32 / lpr)), M or n_ids).
__device__ __forceinline__ float seg_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int WDT, bool ID>
__device__ __forceinline__ void mmv_seg(TV d, TV w, TV x, TV ids, int lpr) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = (blockIdx.x * MMV_WARPS + warp) * (32 / lpr) + lane / lpr;
    const int m = blockIdx.y, N = ID ? w.n[2] : tv_rows(w), K = w.n[3], nvec = K / VEC, v = lane % lpr;
    const bool valid = row < N;
    const int r = valid ? row : 0;
    const int xrows = tv_rows(x);
    u32x4 cur[MMV_UNROLL] = {};
    const char* wr = w.p;
    if (!ID) {  // weights: independent of earlier kernels
        wr += tv_row_off(w, w.n, r);
        prefetch(wr, nvec, v, lpr, valid, cur);
    }
    PDL_WAIT(first_read);
    i64 e = 0;
    float x0 = 0.0f;
    if (ID) e = ldi_v(ids.p + tv_off(ids, ids.n, m), ids.dt);
    else x0 = ldf_v(x.p + tv_row_off(x, x.n, m), DT_F32);
    PDL_WAIT(late);
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, ID ? (xrows > 1 ? m : 0) : m));
    if (ID) {
        wr += e * w.s[1] + (i64)r * w.s[2];
        prefetch(wr, nvec, v, lpr, valid, cur);
    }
    float acc = valid ? row_dot<WDT>(wr, xr, nvec, v, lpr, cur) : 0.0f;
    acc = seg_sum(acc + 0.0f * x0, lpr);
    PDL_TRIGGER(after_main_loop);
    if (valid && v == 0) stf(d.p + tv_off(d, d.n, m * N + row), d.dt, acc);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_seg_f16(TV d, TV w, TV x, int lpr) {
    mmv_seg<DT_F16, false>(d, w, x, d, lpr);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_seg_f16(TV d, TV w, TV x, TV ids, int lpr) {
    mmv_seg<DT_F16, true>(d, w, x, ids, lpr);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_seg_bf16(TV d, TV w, TV x, int lpr) {
    mmv_seg<DT_BF16, false>(d, w, x, d, lpr);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_seg_bf16(TV d, TV w, TV x, TV ids, int lpr) {
    mmv_seg<DT_BF16, true>(d, w, x, ids, lpr);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_seg_f32(TV d, TV w, TV x, int lpr) {
    mmv_seg<DT_F32, false>(d, w, x, d, lpr);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_seg_f32(TV d, TV w, TV x, TV ids, int lpr) {
    mmv_seg<DT_F32, true>(d, w, x, ids, lpr);
}

// Operands of output element ``o`` for the fallback mat-vecs (k_mul_mat_generic, k_mul_mat_cols):
// the x row and the weight row (of expert ids[m] with ids). Holds the kernels' PDL waits: index
// math before `first_read`, the first dependent reads (ids, x[0]) before `late`.
__device__ __forceinline__ bool mm_fallback_operands(const TV& w, const TV& x, const TV& ids, int has_ids, int o,
                                                     const char*& xr, const char*& wr, float& x0) {
    const int N = has_ids ? w.n[2] : tv_rows(w);
    const int M = has_ids ? tv_numel(ids) : tv_rows(x);
    const bool valid = o < M * N;
    const int m = valid ? o / N : 0, n = valid ? o % N : 0;
    const int xrows = tv_rows(x);
    PDL_WAIT(first_read);
    i64 e = 0;
    if (has_ids) e = ldi_v(ids.p + tv_off(ids, ids.n, m), ids.dt);
    xr = x.p + tv_row_off(x, x.n, has_ids ? (xrows > 1 ? m : 0) : m);
    x0 = ldf_v(xr, x.dt);
    PDL_WAIT(late);
    wr = w.p + (has_ids ? e * w.s[1] + (i64)n * w.s[2] : tv_row_off(w, w.n, n));
    return valid;
}

// Fallback for any layout the vector kernels cannot take (unaligned rows, K not a multiple of
// the vector width): one warp per output element, scalar strided loads. Without ids, w rows
// span TV axes 0..2 as in the vector kernel; with ids, w is [E, N, K] on axes 1..3.
template <bool ADD>
__device__ __forceinline__ void mm_generic(TV d, TV w, TV x, TV ids, int has_ids, TV b) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = blockIdx.x * (blockDim.x >> 5) + warp;
    const int K = w.n[3];
    const char *xr, *wr;
    float x0;
    const bool valid = mm_fallback_operands(w, x, ids, has_ids, o, xr, wr, x0);
    float acc = 0.0f;
    if (valid)
        for (int k = lane; k < K; k += 32)
            acc += ldf(wr + (i64)k * w.s[3], w.dt) * (k == 0 ? x0 : ldf(xr + (i64)k * x.s[3], x.dt));
    acc = warp_sum(acc);
    const float addend = (ADD && valid) ? ldf(b.p + tv_off(b, b.n, o), b.dt) : 0.0f;
    PDL_TRIGGER(after_main_loop);
    if (valid && lane == 0) stf(d.p + tv_off(d, d.n, o), d.dt, ADD ? acc + addend : acc);
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_mul_mat_generic(TV d, TV w, TV x, TV ids, int has_ids) {
    mm_generic<false>(d, w, x, ids, has_ids, d);
}
extern "C" __global__ void k_mul_mat_generic_add(TV d, TV w, TV x, TV ids, int has_ids, TV b) {
    mm_generic<true>(d, w, x, ids, has_ids, b);
}

// Fallback for weights stored input-major (a transposed view: the K axis is the strided one and
// consecutive outputs are adjacent in memory; gpt-oss's experts were, before the graph stored
// them output-major): one thread per output element, looping over K,
// so a warp's loads of one k are coalesced across its outputs. Same argument layout as
// k_mul_mat_generic.
template <bool ADD>
__device__ __forceinline__ void mm_cols(TV d, TV w, TV x, TV ids, int has_ids, TV b) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    const int K = w.n[3];
    const char *xr, *wr;
    float x0;
    const bool valid = mm_fallback_operands(w, x, ids, has_ids, o, xr, wr, x0);
    float acc = 0.0f;
    if (valid)
        for (int k = 0; k < K; ++k)
            acc = fmaf(ldf(wr + (i64)k * w.s[3], w.dt), k == 0 ? x0 : ldf(xr + (i64)k * x.s[3], x.dt), acc);
    const float addend = (ADD && valid) ? ldf(b.p + tv_off(b, b.n, o), b.dt) : 0.0f;
    PDL_TRIGGER(after_main_loop);
    if (valid) stf(d.p + tv_off(d, d.n, o), d.dt, ADD ? acc + addend : acc);
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_mul_mat_cols(TV d, TV w, TV x, TV ids, int has_ids) {
    mm_cols<false>(d, w, x, ids, has_ids, d);
}
extern "C" __global__ void k_mul_mat_cols_add(TV d, TV w, TV x, TV ids, int has_ids, TV b) {
    mm_cols<true>(d, w, x, ids, has_ids, b);
}

// MUL_MAT_GLU (the mul-mat-glu fusion, llama.cpp's gate/up mat-vec): d = silu(x @ wg.T) *
// (x @ wu.T), wg and wu of one shape and layout as in k_mul_mat_vec_*, grid and splits as
// there. Each warp streams its gate row, then its up row (both prefetched ahead of the wait:
// weights), and the block reduces both sums through shared memory in a fixed order.
template <int WDT>
__device__ __forceinline__ void mmv_glu(TV d, TV wg, TV wu, TV x, int splits) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    __shared__ float partial[2][MMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    const int row = blockIdx.x * (MMV_WARPS / splits) + warp / splits;
    const int m = blockIdx.y, N = tv_rows(wg), K = wg.n[3], nvec = K / VEC, step = 32 * splits;
    const int v = part * 32 + lane;
    const bool valid = row < N;
    const char* gr = wg.p + tv_row_off(wg, wg.n, valid ? row : 0);
    const char* ur = wu.p + tv_row_off(wu, wu.n, valid ? row : 0);
    u32x4 cur[MMV_UNROLL] = {};
    prefetch(gr, nvec, v, step, valid, cur);
    PDL_WAIT(first_read);
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, m));
    const float x0 = ldf_v((const char*)xr, DT_F32);
    PDL_WAIT(late);
    float g = valid ? row_dot<WDT>(gr, xr, nvec, v, step, cur) : 0.0f;
    prefetch(ur, nvec, v, step, valid, cur);
    float u = valid ? row_dot<WDT>(ur, xr, nvec, v, step, cur) : 0.0f;
    g = warp_sum(g + 0.0f * x0);
    u = warp_sum(u);
    PDL_TRIGGER(after_main_loop);
    if (splits > 1) {
        if (lane == 0) { partial[0][warp] = g; partial[1][warp] = u; }
        __syncthreads();
        if (lane == 0 && part == 0)
            for (int p = 1; p < splits; ++p) { g += partial[0][warp + p]; u += partial[1][warp + p]; }
    }
    if (valid && lane == 0 && part == 0) stf(d.p + tv_off(d, d.n, m * N + row), d.dt, silu_f(g) * u);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f16_glu(TV d, TV wg, TV wu, TV x, int splits) {
    mmv_glu<DT_F16>(d, wg, wu, x, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_bf16_glu(TV d, TV wg, TV wu, TV x, int splits) {
    mmv_glu<DT_BF16>(d, wg, wu, x, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_vec_f32_glu(TV d, TV wg, TV wu, TV x, int splits) {
    mmv_glu<DT_F32>(d, wg, wu, x, splits);
}

// MUL_MAT_GLU for layouts the vector kernel cannot take: one warp per output, scalar strided
// loads of both weight rows (rows on TV axes 0..2 as in k_mul_mat_generic).
extern "C" __global__ void k_mul_mat_glu_generic(TV d, TV wg, TV wu, TV x) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = blockIdx.x * (blockDim.x >> 5) + warp;
    const int N = tv_rows(wg), K = wg.n[3], M = tv_rows(x);
    const bool valid = o < M * N;
    const int m = valid ? o / N : 0, n = valid ? o % N : 0;
    const char* gr = wg.p + tv_row_off(wg, wg.n, n);
    const char* ur = wu.p + tv_row_off(wu, wu.n, n);
    PDL_WAIT(first_read);
    const char* xr = x.p + tv_row_off(x, x.n, m);
    const float x0 = ldf_v(xr, x.dt);
    PDL_WAIT(late);
    float g = 0.0f, u = 0.0f;
    if (valid)
        for (int k = lane; k < K; k += 32) {
            const float xv = k == 0 ? x0 : ldf(xr + (i64)k * x.s[3], x.dt);
            g += ldf(gr + (i64)k * wg.s[3], wg.dt) * xv;
            u += ldf(ur + (i64)k * wu.s[3], wu.dt) * xv;
        }
    g = warp_sum(g);
    u = warp_sum(u);
    PDL_TRIGGER(after_main_loop);
    if (valid && lane == 0) stf(d.p + tv_off(d, d.n, o), d.dt, silu_f(g) * u);
    PDL_TRIGGER(end);
}

// MUL_MAT_ID_GLU (the mul-mat-glu fusion of MoE experts): d[i] = silu(wg[ids[i]] @ x) *
// (wu[ids[i]] @ x), x row i (or 0); wg, wu [E, N, K] on TV axes 1..3 as in k_mul_mat_id_*,
// grid = (ceil(N / rows per block), n_ids). The expert is known only after reading ids.
template <int WDT>
__device__ __forceinline__ void mmv_id_glu(TV d, TV wg, TV wu, TV x, TV ids, int splits) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int VEC = WDT == DT_F32 ? 4 : 8;
    __shared__ float partial[2][MMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % splits;
    const int row = blockIdx.x * (MMV_WARPS / splits) + warp / splits;
    const int slot = blockIdx.y, N = wg.n[2], K = wg.n[3], nvec = K / VEC, step = 32 * splits;
    const int v = part * 32 + lane;
    const bool valid = row < N;
    const int xrows = tv_rows(x);
    PDL_WAIT(first_read);
    const i64 e = ldi_v(ids.p + tv_off(ids, ids.n, slot), ids.dt);
    PDL_WAIT(late);
    const i64 r = valid ? row : 0;
    const char* gr = wg.p + e * wg.s[1] + r * wg.s[2];
    const char* ur = wu.p + e * wu.s[1] + r * wu.s[2];
    const float* xr = (const float*)(x.p + tv_row_off(x, x.n, xrows > 1 ? slot : 0));
    u32x4 cur[MMV_UNROLL] = {};
    prefetch(gr, nvec, v, step, valid, cur);
    float g = valid ? row_dot<WDT>(gr, xr, nvec, v, step, cur) : 0.0f;
    prefetch(ur, nvec, v, step, valid, cur);
    float u = valid ? row_dot<WDT>(ur, xr, nvec, v, step, cur) : 0.0f;
    g = warp_sum(g);
    u = warp_sum(u);
    PDL_TRIGGER(after_main_loop);
    if (splits > 1) {
        if (lane == 0) { partial[0][warp] = g; partial[1][warp] = u; }
        __syncthreads();
        if (lane == 0 && part == 0)
            for (int p = 1; p < splits; ++p) { g += partial[0][warp + p]; u += partial[1][warp + p]; }
    }
    if (valid && lane == 0 && part == 0) stf(d.p + tv_off(d, d.n, slot * N + row), d.dt, silu_f(g) * u);
    PDL_TRIGGER(end);
}

extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_f16_glu(TV d, TV wg, TV wu, TV x, TV ids, int splits) {
    mmv_id_glu<DT_F16>(d, wg, wu, x, ids, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_bf16_glu(TV d, TV wg, TV wu, TV x, TV ids, int splits) {
    mmv_id_glu<DT_BF16>(d, wg, wu, x, ids, splits);
}
extern "C" __global__ void __launch_bounds__(256) k_mul_mat_id_f32_glu(TV d, TV wg, TV wu, TV x, TV ids, int splits) {
    mmv_id_glu<DT_F32>(d, wg, wu, x, ids, splits);
}

// MUL_MAT_ID_GLU for layouts the vector kernel cannot take (input-major views, K not a
// multiple of the vector width): one warp per output, scalar strided loads of both rows.
extern "C" __global__ void k_mul_mat_id_glu_generic(TV d, TV wg, TV wu, TV x, TV ids) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = blockIdx.x * (blockDim.x >> 5) + warp;
    const int N = wg.n[2], K = wg.n[3], M = tv_numel(ids), xrows = tv_rows(x);
    const bool valid = o < M * N;
    const int m = valid ? o / N : 0, n = valid ? o % N : 0;
    PDL_WAIT(first_read);
    const i64 e = ldi_v(ids.p + tv_off(ids, ids.n, m), ids.dt);
    PDL_WAIT(late);
    const char* gr = wg.p + e * wg.s[1] + (i64)n * wg.s[2];
    const char* ur = wu.p + e * wu.s[1] + (i64)n * wu.s[2];
    const char* xr = x.p + tv_row_off(x, x.n, xrows > 1 ? m : 0);
    float g = 0.0f, u = 0.0f;
    if (valid)
        for (int k = lane; k < K; k += 32) {
            const float xv = ldf(xr + (i64)k * x.s[3], x.dt);
            g += ldf(gr + (i64)k * wg.s[3], wg.dt) * xv;
            u += ldf(ur + (i64)k * wu.s[3], wu.dt) * xv;
        }
    g = warp_sum(g);
    u = warp_sum(u);
    PDL_TRIGGER(after_main_loop);
    if (valid && lane == 0) stf(d.p + tv_off(d, d.n, o), d.dt, silu_f(g) * u);
    PDL_TRIGGER(end);
}
