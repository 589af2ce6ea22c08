// ROPE, NeoX layout (Hugging Face rotate_half): the first n_rot dims of each head rotate in two
// halves, the rest are copied. Angles from the graph's rope_freqs constant, exactly as the
// NumPy twin: ang = float(pos) * inv_freq; cos/sin scaled by attn_factor.
#include "common.cuh"

// The rotation of element i of x (rows on axes 0..2, head_dim on axis 3): sets `ok` and `out`;
// every read happens here, around the PDL waits.
__device__ __forceinline__ float rope_elem(const TV& x, const TV& pos, const TV& freqs, int n_rot,
                                           float attn_factor, int i, bool& ok) {
    const int hd = x.n[3];
    ok = i < tv_numel(x);
    const int r = i / hd, j = i % hd, half = n_rot / 2;
    const bool rot = j < n_rot;
    const int fi = j < half ? j : j - half;
    const float inv_freq = (ok && rot) ? ldf(freqs.p + (i64)fi * freqs.s[3], freqs.dt) : 0.0f;  // constant
    const char* xr = x.p + (ok ? tv_row_off(x, x.n, r) : 0);
    PDL_WAIT(first_read);
    const float xj = ok ? ldf_v(xr + (i64)j * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    float out = xj;
    if (ok && rot) {
        const float p = (float)ldi(pos.p, pos.dt);
        const float ang = p * inv_freq;
        const float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
        if (j < half) {
            const float x2 = ldf(xr + (i64)(j + half) * x.s[3], x.dt);
            out = xj * c - x2 * s;
        } else {
            const float x1 = ldf(xr + (i64)(j - half) * x.s[3], x.dt);
            out = xj * c + x1 * s;
        }
    }
    return out;
}

// x, d: [.., heads, head_dim] (rows on axes 0..2, head_dim on axis 3); pos: 1 element;
// freqs: [n_rot / 2] f32 constant.
extern "C" __global__ void k_rope(TV d, TV x, TV pos, TV freqs, int n_rot, float attn_factor) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x, hd = x.n[3];
    bool ok;
    const float out = rope_elem(x, pos, freqs, n_rot, attn_factor, i, ok);
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + tv_row_off(d, x.n, i / hd) + (i64)(i % hd) * d.s[3], d.dt, out);
    PDL_TRIGGER(end);
}

// ROPE_SET_ROWS (the rope-set-rows fusion, ggml's rope + view + set_rows): element i of the
// rotated x is element i % R of cache row idx[i / R] (R = one cache row's elements, as
// k_set_rows); cache with its row axis on TV axis 0 (rows_first).
extern "C" __global__ void k_rope_set_rows(TV cache, TV x, TV pos, TV freqs, TV idx, int n_rot, float attn_factor) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int R = cache.n[1] * cache.n[2] * cache.n[3];
    const int slot = i / R, inner = i % R;
    const int shape[4] = {1, cache.n[1], cache.n[2], cache.n[3]};
    const i64 oc = tv_off(cache, shape, inner);
    bool ok;
    const float out = rope_elem(x, pos, freqs, n_rot, attn_factor, i, ok);
    const i64 row = ok ? ldi(idx.p + tv_off(idx, idx.n, slot), idx.dt) : 0;
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(cache.p + row * cache.s[0] + oc, cache.dt, out);
    PDL_TRIGGER(end);
}
