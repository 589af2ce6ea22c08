// The gated-delta-net ops of Qwen3-Next: SSM_CONV (short causal depthwise conv of one token,
// with its new conv state) and GATED_DELTA_NET (one token of the gated delta rule, with its new
// recurrent state). Both write the state wherever outs[1] points: the op's output tail in the
// model graph, or the state cache itself once copy elimination redirects it (seed 002). Then the
// state is read and written in place, so every thread reads each state element it owns before
// it overwrites it and no thread touches another's elements.
#include "common.cuh"

#define CONV_MAXK 8
#define GDN_MAXK 256
#define GDN_ROWGROUPS 4

// out: [C] flat; new_state, state: [C, K-1] (axes 2..3); x: [C] flat; kern: [C, K] (axes 2..3).
// One thread per channel.
extern "C" __global__ void k_ssm_conv(TV out, TV new_state, TV state, TV x, TV kern) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int C = kern.n[2], K = kern.n[3];
    const bool ok = c < C;
    float w[CONV_MAXK], win[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK; ++j)  // conv taps: a weight, read before the wait
        w[j] = (ok && j < K) ? ldf(kern.p + (i64)c * kern.s[2] + (i64)j * kern.s[3], kern.dt) : 0.0f;
    PDL_WAIT(first_read);
    const float xc = ok ? ldf_v(x.p + tv_off(x, x.n, c), x.dt) : 0.0f;
    PDL_WAIT(late);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < CONV_MAXK; ++j) {
        if (j < K - 1) win[j] = ok ? ldf(state.p + (i64)c * state.s[2] + (i64)j * state.s[3], state.dt) : 0.0f;
        else if (j == K - 1) win[j] = xc;
        else win[j] = 0.0f;
        acc = fmaf(win[j], w[j], acc);
    }
    PDL_TRIGGER(after_main_loop);
    if (ok) {
        stf(out.p + tv_off(out, out.n, c), out.dt, acc);
#pragma unroll
        for (int j = 0; j + 1 < CONV_MAXK; ++j)
            if (j < K - 1) stf(new_state.p + (i64)c * new_state.s[2] + (i64)j * new_state.s[3], new_state.dt, win[j + 1]);
    }
    PDL_TRIGGER(end);
}

// out: [H_v * d_v] flat; new_state, state: [H_v, d_k, d_v] (axes 1..3); q, k: H_v * d_k
// elements in flat order (stride-0 broadcast views of the key heads); v: H_v * d_v flat;
// g, beta: H_v flat. grid = (H_v, ceil(d_v / 32)); block = 32 columns x GDN_ROWGROUPS row groups.
extern "C" __global__ void __launch_bounds__(32 * GDN_ROWGROUPS)
k_gated_delta_net(TV out, TV new_state, TV q, TV k, TV v, TV g, TV beta, TV state, float scale) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float qs[GDN_MAXK], ks[GDN_MAXK];
    __shared__ float red[GDN_ROWGROUPS][32];
    const int tid = threadIdx.x, lane = tid & 31, rg = tid >> 5;
    const int h = blockIdx.x, c = blockIdx.y * 32 + lane;
    const int DK = state.n[2], DV = state.n[3];
    const bool ok = c < DV;
    PDL_WAIT(first_read);
    const float q0 = tid < DK ? ldf_v(q.p + tv_off(q, q.n, h * DK + tid), q.dt) : 0.0f;
    PDL_WAIT(late);
    for (int i = tid; i < DK; i += blockDim.x) {
        qs[i] = i == tid ? q0 : ldf(q.p + tv_off(q, q.n, h * DK + i), q.dt);
        ks[i] = ldf(k.p + tv_off(k, k.n, h * DK + i), k.dt);
    }
    const float decay = expf(ldf(g.p + tv_off(g, g.n, h), g.dt));
    const float b = ldf(beta.p + tv_off(beta, beta.n, h), beta.dt);
    const float vc = ok ? ldf(v.p + tv_off(v, v.n, h * DV + c), v.dt) : 0.0f;
    __syncthreads();
    const char* src = state.p + (i64)h * state.s[1] + (i64)c * state.s[3];
    char* dst = new_state.p + (i64)h * new_state.s[1] + (i64)c * new_state.s[3];
    // kv_mem[c] = sum_i (decay * S[i, c]) * k[i]
    float kv = 0.0f;
    if (ok)
        for (int i = rg; i < DK; i += GDN_ROWGROUPS) kv += decay * ldf(src + (i64)i * state.s[2], state.dt) * ks[i];
    red[rg][lane] = kv;
    __syncthreads();
    kv = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_ROWGROUPS; ++r) kv += red[r][lane];
    const float delta = (vc - kv) * b;
    __syncthreads();
    // S'[i, c] = decay * S[i, c] + k[i] * delta[c];  out[c] = scale * sum_i S'[i, c] * q[i]
    float o = 0.0f;
    if (ok)
        for (int i = rg; i < DK; i += GDN_ROWGROUPS) {
            const float s = decay * ldf(src + (i64)i * state.s[2], state.dt) + ks[i] * delta;
            o += s * qs[i];
            stf(dst + (i64)i * new_state.s[2], new_state.dt, s);
        }
    red[rg][lane] = o;
    __syncthreads();
    PDL_TRIGGER(after_main_loop);
    if (rg == 0 && ok) {
        float total = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_ROWGROUPS; ++r) total += red[r][lane];
        stf(out.p + tv_off(out, out.n, h * DV + c), out.dt, total * scale);
    }
    PDL_TRIGGER(end);
}
