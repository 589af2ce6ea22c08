// Elementwise ops over strided views: binary with broadcasting (ADD, MUL, DIV, GLU variants),
// unary (SCALE, SIGMOID, SOFTPLUS, SILU, CPY), ADD_ID, and the row gathers/scatters GET_ROWS and
// SET_ROWS. One thread per output element.
//
// Index convention: the host aligns every source to the iteration shape (broadcast axes get
// byte stride 0), so a flat index unravels over the sources' own TV.n and over the
// destination's TV.n separately (the destination may be a reshaped or copy-eliminated view).
#include "common.cuh"

#define OP_ADD 0
#define OP_MUL 1
#define OP_DIV 2
#define OP_SWIGLU 3
#define OP_SWIGLU_OAI 4
#define OP_SCALE 10
#define OP_SIGMOID 11
#define OP_SOFTPLUS 12
#define OP_CPY 13
#define OP_SILU 14

template <int OP>
__device__ __forceinline__ float apply(float x, float y, float p0, float p1) {
    if (OP == OP_ADD) return x + y;
    if (OP == OP_MUL) return x * y;
    if (OP == OP_DIV) return x / y;
    if (OP == OP_SWIGLU) return silu_f(x) * y;
    if (OP == OP_SWIGLU_OAI) {  // gpt-oss: p0 = alpha, p1 = limit
        const float g = fminf(x, p1);
        const float u = fminf(fmaxf(y, -p1), p1);
        return (u + 1.0f) * (g * sigmoid_f(g * p0));
    }
    if (OP == OP_SCALE) return x * p0;
    if (OP == OP_SIGMOID) return sigmoid_f(x);
    if (OP == OP_SOFTPLUS) return x > 20.0f ? x : log1pf(expf(fminf(x, 20.0f)));
    if (OP == OP_SILU) return silu_f(x);
    return x;  // OP_CPY
}

template <int OP, bool BINARY>
__device__ __forceinline__ void ew(TV d, TV a, TV b, float p0, float p1) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < tv_numel(d);
    i64 oa = 0, ob = 0, od = 0;
    if (ok) {
        oa = tv_off(a, a.n, i);
        od = tv_off(d, d.n, i);
        if (BINARY) ob = tv_off(b, b.n, i);
    }
    PDL_WAIT(first_read);
    const float x = ok ? ldf_v(a.p + oa, a.dt) : 0.0f;
    PDL_WAIT(late);
    const float y = (BINARY && ok) ? ldf(b.p + ob, b.dt) : 0.0f;
    const float r = apply<OP>(x, y, p0, p1);
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + od, d.dt, r);
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_add(TV d, TV a, TV b) { ew<OP_ADD, true>(d, a, b, 0.0f, 0.0f); }
extern "C" __global__ void k_mul(TV d, TV a, TV b) { ew<OP_MUL, true>(d, a, b, 0.0f, 0.0f); }
extern "C" __global__ void k_div(TV d, TV a, TV b) { ew<OP_DIV, true>(d, a, b, 0.0f, 0.0f); }
extern "C" __global__ void k_swiglu(TV d, TV g, TV u) { ew<OP_SWIGLU, true>(d, g, u, 0.0f, 0.0f); }
extern "C" __global__ void k_swiglu_oai(TV d, TV g, TV u, float alpha, float limit) {
    ew<OP_SWIGLU_OAI, true>(d, g, u, alpha, limit);
}
extern "C" __global__ void k_scale(TV d, TV a, float s) { ew<OP_SCALE, false>(d, a, a, s, 0.0f); }
extern "C" __global__ void k_sigmoid(TV d, TV a) { ew<OP_SIGMOID, false>(d, a, a, 0.0f, 0.0f); }
extern "C" __global__ void k_softplus(TV d, TV a) { ew<OP_SOFTPLUS, false>(d, a, a, 0.0f, 0.0f); }
extern "C" __global__ void k_silu(TV d, TV a) { ew<OP_SILU, false>(d, a, a, 0.0f, 0.0f); }
extern "C" __global__ void k_cpy(TV d, TV a) { ew<OP_CPY, false>(d, a, a, 0.0f, 0.0f); }

// d[i, j] = x[i, j] + bias[ids[i], j]   (gpt-oss expert biases). Iteration shape [k, N]:
// x and d are unravelled over their own shapes, bias is [E, N] (rows on axis 2, N on axis 3).
extern "C" __global__ void k_add_id(TV d, TV x, TV bias, TV ids, int ncols) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < tv_numel(d);
    const int slot = i / ncols, col = i % ncols;
    i64 ox = 0, od = 0;
    if (ok) {
        ox = tv_off(x, x.n, i);
        od = tv_off(d, d.n, i);
    }
    PDL_WAIT(first_read);
    const float xv = ok ? ldf_v(x.p + ox, x.dt) : 0.0f;
    PDL_WAIT(late);
    float r = 0.0f;
    if (ok) {
        const i64 e = ldi(ids.p + tv_off(ids, ids.n, slot), ids.dt);
        r = xv + ldf(bias.p + e * bias.s[2] + (i64)col * bias.s[3], bias.dt);
    }
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + od, d.dt, r);
    PDL_TRIGGER(end);
}

// GET_ROWS: d (flat [k, R]) = table[ids] with the table's row axis on TV axis 0 and the R
// elements of a row on axes 1..3 (host layout); ids read in flat order.
extern "C" __global__ void k_get_rows(TV d, TV table, TV ids) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int R = table.n[1] * table.n[2] * table.n[3];
    const bool ok = i < tv_numel(d);
    const int slot = i / R, inner = i % R;
    i64 od = 0, ot = 0;
    if (ok) {
        od = tv_off(d, d.n, i);
        const int shape[4] = {1, table.n[1], table.n[2], table.n[3]};
        ot = tv_off(table, shape, inner);
    }
    PDL_WAIT(first_read);
    const i64 row = ok ? ldi_v(ids.p + tv_off(ids, ids.n, slot), ids.dt) : 0;
    PDL_WAIT(late);
    float r = 0.0f;
    if (ok) r = ldf(table.p + row * table.s[0] + ot, table.dt);
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + od, d.dt, r);
    PDL_TRIGGER(end);
}

// SET_ROWS: cache[idx[j]] = rows[j] (converted to the cache dtype). The cache view has its
// row axis on TV axis 0 and a row's R elements on axes 1..3; `rows` is unravelled over its
// own shape in flat order [n_idx, R], as the NumPy twin reshapes it.
extern "C" __global__ void k_set_rows(TV cache, TV rows, TV idx) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int R = cache.n[1] * cache.n[2] * cache.n[3];
    const bool ok = i < tv_numel(rows);
    const int slot = i / R, inner = i % R;
    i64 orow = 0, oc = 0;
    if (ok) {
        orow = tv_off(rows, rows.n, i);
        const int shape[4] = {1, cache.n[1], cache.n[2], cache.n[3]};
        oc = tv_off(cache, shape, inner);
    }
    PDL_WAIT(first_read);
    const float v = ok ? ldf_v(rows.p + orow, rows.dt) : 0.0f;
    PDL_WAIT(late);
    i64 dst = 0;
    if (ok) dst = ldi(idx.p + tv_off(idx, idx.n, slot), idx.dt);
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(cache.p + dst * cache.s[0] + oc, cache.dt, v);
    PDL_TRIGGER(end);
}

// ADD_CHAIN (the add-chain fusion, ggml's multi-add): d = ((a + b) + c) + e, summed left to right
// as the ADDs it replaces; sources aligned to d's iteration shape; n = 3 or 4 sources (the
// unused one is any valid view, never read).
extern "C" __global__ void k_add_chain(TV d, TV a, TV b, TV c, TV e, int n) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < tv_numel(d);
    i64 oa = 0, ob = 0, oc = 0, oe = 0, od = 0;
    if (ok) {
        oa = tv_off(a, a.n, i);
        ob = tv_off(b, b.n, i);
        oc = tv_off(c, c.n, i);
        if (n > 3) oe = tv_off(e, e.n, i);
        od = tv_off(d, d.n, i);
    }
    PDL_WAIT(first_read);
    const float x = ok ? ldf_v(a.p + oa, a.dt) : 0.0f;
    PDL_WAIT(late);
    float r = 0.0f;
    if (ok) {
        r = (x + ldf(b.p + ob, b.dt)) + ldf(c.p + oc, c.dt);
        if (n > 3) r = r + ldf(e.p + oe, e.dt);
    }
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + od, d.dt, r);
    PDL_TRIGGER(end);
}
