// The gated-delta-net ops of Qwen3-Next: SSM_CONV (short causal depthwise conv of one token,
// with its new conv state) and GATED_DELTA_NET (one token of the gated delta rule, with its new
// recurrent state). Both write the state wherever outs[1] points: the op's output tail in the
// model graph, or the state cache itself once copy elimination redirects it (seed 002). Then the
// state is read and written in place, so every thread reads each state element it owns before
// it overwrites it and no thread touches another's elements.
#include "common.cuh"

#define CONV_MAXK 8
#define GDN_MAXK 256
#define GDN_ROWGROUPS 8  // at most: the binding launches ceil(d_k / GDN_MAXR) of them
#define GDN_MAXR 32

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

// out: [H_v * d_v] flat; new_state, state: [H_v, d_k, d_v] f32 (axes 1..3); q, k: H_v * d_k
// elements in flat order (stride-0 broadcast views of the key heads); v: H_v * d_v flat;
// g, beta: H_v flat. grid = (H_v, ceil(d_v / 32)); block = 32 columns x RG row groups, RG =
// ceil(d_k / GDN_MAXR) <= GDN_ROWGROUPS. A thread owns column c of rows rg, rg + RG, ...
// (at most GDN_MAXR): it loads them all into registers
// at once (every load in flight together, the state read once), then reduces k^T S and q^T S'
// across the row groups through shared memory. The earlier loop (one row's load, multiply and
// add at a time, the state read twice) took 7.5 us of a Qwen3-Next layer on an H200 with PDL off,
// llama.cpp's register kernel 2.6 (data/bench/decode_trace_qwen3-next-80b-a3b_f16_h200.json).
extern "C" __global__ void __launch_bounds__(32 * GDN_ROWGROUPS)
k_gated_delta_net(TV out, TV new_state, TV q, TV k, TV v, TV g, TV beta, TV state, float scale) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float qs[GDN_MAXK], ks[GDN_MAXK];
    __shared__ float red[GDN_ROWGROUPS][32];
    const int tid = threadIdx.x, lane = tid & 31, rg = tid >> 5, RG = blockDim.x >> 5;
    const int h = blockIdx.x, c = blockIdx.y * 32 + lane;
    const int DK = state.n[2], DV = state.n[3];
    const bool ok = c < DV;
    const i64 row = (i64)state.s[2] * RG, nrow = (i64)new_state.s[2] * RG;
    const char* src = state.p + (i64)h * state.s[1] + (i64)c * state.s[3] + (i64)rg * state.s[2];
    char* dst = new_state.p + (i64)h * new_state.s[1] + (i64)c * new_state.s[3] + (i64)rg * new_state.s[2];
    PDL_WAIT(first_read);
    const float q0 = tid < DK ? ldf_v(q.p + tv_off(q, q.n, h * DK + tid), q.dt) : 0.0f;
    PDL_WAIT(late);
    float s[GDN_MAXR];  // S[rg + RG * r, c]
#pragma unroll
    for (int r = 0; r < GDN_MAXR; ++r)
        s[r] = ok && rg + RG * r < DK ? *(const float*)(src + r * row) : 0.0f;
    if (tid < DK) {  // the block has at least d_k threads (32 * ceil(d_k / GDN_MAXR) >= d_k)
        qs[tid] = q0;
        ks[tid] = ldf(k.p + tv_off(k, k.n, h * DK + tid), k.dt);
    }
    const float decay = expf(ldf(g.p + tv_off(g, g.n, h), g.dt));
    const float b = ldf(beta.p + tv_off(beta, beta.n, h), beta.dt);
    const float vc = ok ? ldf(v.p + tv_off(v, v.n, h * DV + c), v.dt) : 0.0f;
    __syncthreads();
    // kv_mem[c] = sum_i (decay * S[i, c]) * k[i]
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_MAXR; ++r)
        if (rg + RG * r < DK) kv += decay * s[r] * ks[rg + RG * r];
    red[rg][lane] = kv;
    __syncthreads();
    kv = 0.0f;
    for (int r = 0; r < RG; ++r) kv += red[r][lane];
    const float delta = (vc - kv) * b;
    __syncthreads();
    // S'[i, c] = decay * S[i, c] + k[i] * delta[c];  out[c] = scale * sum_i S'[i, c] * q[i]
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_MAXR; ++r) {
        const int i = rg + RG * r;
        if (i < DK) {
            const float sn = decay * s[r] + ks[i] * delta;
            o += sn * qs[i];
            if (ok) *(float*)(dst + r * nrow) = sn;
        }
    }
    red[rg][lane] = o;
    __syncthreads();
    PDL_TRIGGER(after_main_loop);
    if (rg == 0 && ok) {
        float total = 0.0f;
        for (int r = 0; r < RG; ++r) total += red[r][lane];
        stf(out.p + tv_off(out, out.n, h * DV + c), out.dt, total * scale);
    }
    PDL_TRIGGER(end);
}
