// ROPE, NeoX layout (Hugging Face rotate_half): the first n_rot dims of each head rotate in two
// halves, the rest are copied. Angles from the graph's rope_freqs constant, exactly as the
// NumPy twin: ang = float(pos) * inv_freq; cos/sin scaled by attn_factor.
#include "common.cuh"

// x, d: [.., heads, head_dim] (rows on axes 0..2, head_dim on axis 3); pos: 1 element;
// freqs: [n_rot / 2] f32 constant.
extern "C" __global__ void k_rope(TV d, TV x, TV pos, TV freqs, int n_rot, float attn_factor) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int hd = x.n[3];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < tv_numel(x);
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
    PDL_TRIGGER(after_main_loop);
    if (ok) stf(d.p + tv_row_off(d, x.n, r) + (i64)j * d.s[3], d.dt, out);
    PDL_TRIGGER(end);
}
