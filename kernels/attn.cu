// FLASH_ATTN_EXT for one decode token, split along the context (flash-decoding): block (h, s)
// handles query head h over key chunk s with an online softmax per warp, combines its warps,
// and writes a partial (max, sum, acc[D]) to a per-node workspace. The last block of head h to
// finish (atomic ticket) merges the S partials in a fixed order (so the result does not depend
// on which block came last: graph replays are bit-identical), adds the attention sink when the
// model has one (gpt-oss), writes the output and resets the ticket for the next launch.
#include "common.cuh"

#define FA_WARPS 4
#define FA_MAXD 256
#define FA_PER_LANE (FA_MAXD / 32)

template <int KDT>
__device__ __forceinline__ float ldk(const char* p) {
    if (KDT == DT_F16) return h2f(*(const u16*)p);
    if (KDT == DT_BF16) return bf2f(*(const u16*)p);
    return *(const float*)p;
}

// q: [H, D] (axes 2..3); k, v: [n_kv, H_kv, D] (axes 1..3); mask: [n_kv] (axis 3);
// sinks: [H] (axis 3) when has_sinks; d: flat [H * D]. grid = (H, S), block = 32 * FA_WARPS.
// ws: H * S * (D + 2) floats; tickets: H ints, zero between launches.
template <int KDT>
__device__ __forceinline__ void flash_attn_decode(TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale,
                                                  int has_sinks, float* ws, int* tickets) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float qs[FA_MAXD];
    __shared__ float wm[FA_WARPS], wl[FA_WARPS];
    __shared__ float wacc[FA_WARPS][FA_MAXD];
    __shared__ int is_last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x, sidx = blockIdx.y, S = gridDim.y;
    const int H = q.n[2], D = q.n[3], n_kv = k.n[1], Hkv = k.n[2];
    const int g = h / (H / Hkv);
    const int chunk = (n_kv + S - 1) / S;
    const int t0 = sidx * chunk, t1 = min(n_kv, t0 + chunk);
    const float sink = has_sinks ? ldf(sinks.p + (i64)h * sinks.s[3], sinks.dt) : 0.0f;  // a weight
    const char* qr = q.p + (i64)h * q.s[2];
    PDL_WAIT(first_read);
    const float q0 = tid < D ? ldf_v(qr + (i64)tid * q.s[3], q.dt) : 0.0f;
    PDL_WAIT(late);
    for (int j = tid; j < D; j += blockDim.x) qs[j] = j == tid ? q0 : ldf(qr + (i64)j * q.s[3], q.dt);
    __syncthreads();
    float qreg[FA_PER_LANE], acc[FA_PER_LANE];
#pragma unroll
    for (int i = 0; i < FA_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        qreg[i] = j < D ? qs[j] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -WB_INF, l = 0.0f;
    const char* kbase = k.p + (i64)g * k.s[2];
    const char* vbase = v.p + (i64)g * v.s[2];
    for (int t = t0 + warp; t < t1; t += FA_WARPS) {
        const float mk = ldf(mask.p + (i64)t * mask.s[3], mask.dt);
        if (mk == -WB_INF) continue;  // uniform over the warp
        const char* kr = kbase + (i64)t * k.s[1];
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < FA_PER_LANE; ++i) {
            const int j = lane + 32 * i;
            if (j < D) p = fmaf(qreg[i], ldk<KDT>(kr + (i64)j * k.s[3]), p);
        }
        const float s = warp_sum(p) * scale + mk;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        const char* vr = vbase + (i64)t * v.s[1];
#pragma unroll
        for (int i = 0; i < FA_PER_LANE; ++i) {
            const int j = lane + 32 * i;
            if (j < D) acc[i] = acc[i] * corr + e * ldk<KDT>(vr + (i64)j * v.s[3]);
        }
        m = mn;
    }
    // Combine the warps of this block into one partial.
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
#pragma unroll
    for (int i = 0; i < FA_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        if (j < D) wacc[warp][j] = acc[i];
    }
    __syncthreads();
    float M = -WB_INF;
    for (int w = 0; w < FA_WARPS; ++w) M = fmaxf(M, wm[w]);
    float* part = ws + ((i64)h * S + sidx) * (D + 2);
    for (int j = tid; j < D; j += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < FA_WARPS; ++w)
            if (wm[w] != -WB_INF) a += wacc[w][j] * expf(wm[w] - M);
        part[2 + j] = a;
    }
    if (tid == 0) {
        float L = 0.0f;
        for (int w = 0; w < FA_WARPS; ++w)
            if (wm[w] != -WB_INF) L += wl[w] * expf(wm[w] - M);
        part[0] = M;
        part[1] = L;
    }
    PDL_TRIGGER(after_main_loop);
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(&tickets[h], 1) == S - 1;
    __syncthreads();
    if (is_last) {
        __threadfence();
        const volatile float* base = ws + (i64)h * S * (D + 2);
        float Mg = has_sinks ? sink : -WB_INF;
        for (int s = 0; s < S; ++s) Mg = fmaxf(Mg, base[(i64)s * (D + 2)]);
        float Lg = has_sinks ? expf(sink - Mg) : 0.0f;
        for (int s = 0; s < S; ++s) {
            const float ms = base[(i64)s * (D + 2)];
            if (ms != -WB_INF) Lg += base[(i64)s * (D + 2) + 1] * expf(ms - Mg);
        }
        const float inv = 1.0f / Lg;
        for (int j = tid; j < D; j += blockDim.x) {
            float a = 0.0f;
            for (int s = 0; s < S; ++s) {
                const float ms = base[(i64)s * (D + 2)];
                if (ms != -WB_INF) a += base[(i64)s * (D + 2) + 2 + j] * expf(ms - Mg);
            }
            stf(d.p + tv_off(d, d.n, h * D + j), d.dt, a * inv);
        }
        if (tid == 0) tickets[h] = 0;
    }
    PDL_TRIGGER(end);
}

#define FA_ARGS TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale, int has_sinks, float *ws, int *tickets
#define FA_PASS d, q, k, v, mask, sinks, scale, has_sinks, ws, tickets
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_f16(FA_ARGS) { flash_attn_decode<DT_F16>(FA_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_bf16(FA_ARGS) { flash_attn_decode<DT_BF16>(FA_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_f32(FA_ARGS) { flash_attn_decode<DT_F32>(FA_PASS); }
