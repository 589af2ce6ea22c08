// ARGSORT_TOP_K of the MoE router and TOPK_MOE (the topk-moe fusion): indices of the k largest
// of one row (n <= TOPK_MAXN), in descending order, ties to the lower index (NumPy's stable
// argsort of -x). One warp, no block barrier: the row is staged in shared memory (batches of
// independent loads), k rounds of a warp arg-max over the untaken entries pick the winners, and
// lane r finishes and stores winner r. A block of 8 warps with a barrier and a serial merge per
// round, and one thread storing every result through the generic view offsets, made k_topk_moe
// take 12 us of a Qwen3-30B-A3B q4_0 layer on an H200 with PDL off
// (data/bench/trace_qwen3-30b-a3b_q4_0_pdl0_9d644a4_h200.csv.gz).
#include "common.cuh"

#define TOPK_MAXN 4096

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    return a > b || (a == b && ia < ib);
}

// The k largest of vals[0..n) by the calling warp, into out_v / out_i[0..k) (lane 0 writes). Entry
// j is read and marked taken only by lane j % 32, so the rounds need no barrier; the butterfly
// leaves every lane with the same winner (better() is a total order).
__device__ __forceinline__ void warp_top_k(const float* vals, unsigned char* taken, int n, int k, float* out_v,
                                           int* out_i) {
    const int lane = threadIdx.x & 31;
    for (int r = 0; r < k; ++r) {
        float bv = -WB_INF;
        int bi = -1;
        for (int j = lane; j < n; j += 32)
            if (!taken[j] && better(vals[j], j, bv, bi)) { bv = vals[j]; bi = j; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (bi >= 0 && lane == (bi & 31)) taken[bi] = 1;
        if (lane == 0) { out_v[r] = bv; out_i[r] = bi; }
    }
    __syncwarp();
}

// The row x (one row on axis 3) into vals, taken cleared; returns the lane's max of its entries.
#define TOPK_BATCH 4
__device__ __forceinline__ float stage_row(TV x, float* vals, unsigned char* taken, int n) {
    const int lane = threadIdx.x & 31;
    PDL_WAIT(first_read);
    const float first = lane < n ? ldf_v(x.p + (i64)lane * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    float m = -WB_INF;
    for (int j0 = 0; j0 < n; j0 += 32 * TOPK_BATCH) {
        float v[TOPK_BATCH];
#pragma unroll
        for (int b = 0; b < TOPK_BATCH; ++b) {  // independent loads, in flight together
            const int j = j0 + 32 * b + lane;
            v[b] = j == lane ? first : (j < n ? ldf(x.p + (i64)j * x.s[3], x.dt) : -WB_INF);
        }
#pragma unroll
        for (int b = 0; b < TOPK_BATCH; ++b) {
            const int j = j0 + 32 * b + lane;
            if (j < n) {
                vals[j] = v[b];
                taken[j] = 0;
                m = fmaxf(m, v[b]);
            }
        }
    }
    return m;
}

// d: [k] i32 (flat); x: one row on axis 3. block = 32 threads.
extern "C" __global__ void k_argsort_top_k(TV d, TV x, int k) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float vals[TOPK_MAXN];
    __shared__ unsigned char taken[TOPK_MAXN];
    __shared__ float top_v[TOPK_MAXN];
    __shared__ int top_i[TOPK_MAXN];
    const int n = x.n[3];
    stage_row(x, vals, taken, n);
    __syncwarp();
    PDL_TRIGGER(after_main_loop);
    warp_top_k(vals, taken, n, k, top_v, top_i);
    for (int r = threadIdx.x; r < k; r += 32) stf(d.p + tv_off(d, d.n, r), d.dt, (float)top_i[r]);
    PDL_TRIGGER(end);
}

// The end of TOPK_MOE once the k winners (values, ids) are in chosen / chosen_id (shared, k <= 64):
// lane r (and r + 32) finishes winner r: gpt-oss's softmax over the chosen logits, the
// renormalisation, the stores.
__device__ __forceinline__ void topk_moe_finish(TV w, TV ids, const float* chosen, const int* chosen_id, int k,
                                                int softmax_first, int norm) {
    const int lane = threadIdx.x & 31;
    float c[2], cm = -WB_INF;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = lane + 32 * i;
        c[i] = r < k ? chosen[r] : -WB_INF;
        cm = fmaxf(cm, c[i]);
    }
    if (!softmax_first) {
        cm = warp_max(cm);
        float cs = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            c[i] = lane + 32 * i < k ? expf(c[i] - cm) : 0.0f;
            cs += c[i];
        }
        cs = warp_sum(cs);
#pragma unroll
        for (int i = 0; i < 2; ++i) c[i] = c[i] / cs;
    }
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) total += lane + 32 * i < k ? c[i] : 0.0f;
    total = warp_sum(total);
    const bool flat_w = w.n[0] == 1 && w.n[1] == 1 && w.n[2] == 1, flat_i = ids.n[0] == 1 && ids.n[1] == 1 && ids.n[2] == 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = lane + 32 * i;
        if (r < k) {
            const float v = norm ? c[i] / total : c[i];
            char* pw = w.p + (flat_w ? (i64)r * w.s[3] : tv_off(w, w.n, r));
            char* pi = ids.p + (flat_i ? (i64)r * ids.s[3] : tv_off(ids, ids.n, r));
            if (w.dt == DT_F32) *(float*)pw = v; else stf(pw, w.dt, v);
            if (ids.dt == DT_I32) *(int*)pi = chosen_id[r]; else stf(pi, ids.dt, (float)chosen_id[r]);
        }
    }
}

// TOPK_MOE (llama.cpp's topk_moe_cuda): the MoE router chain in one warp. x: the router logits
// (one row on axis 3); w: the k weights, ids: the k expert ids (both flat). softmax_first:
// probabilities over all experts first (Qwen3), else a softmax over the k chosen logits
// (gpt-oss); norm: the chosen weights renormalised to sum to one. block = 32 threads.
//
// k_topk_moe (n <= 128: Qwen3-MoE's and gpt-oss's routers) and k_topk_moe_512 (n <= 512,
// Qwen3-Next's): as llama.cpp's kernel, lane l holds entries l, l + 32, ... in registers (PER of
// them, the fewest that hold the row: one warp runs every instruction in series, so an unused slot
// costs its share of each round), a round is the lanes' own best then a butterfly, and the
// winner's lane marks it in a bit mask: no shared row and no barrier. The shared-memory version
// (k_topk_moe_wide) took 7.1 us of a Qwen3-30B-A3B q4_0 layer on an H200 with PDL off
// (data/bench/trace_qwen3-30b-a3b_q4_0_pdl0_dd66418_h200.csv.gz), llama.cpp's 3.5. On an H100,
// this one took 9.4 us with 16 slots for 128 experts (3132 instructions at 5.3 cycles each) and
// 5.5 us with 4 (1664 instructions): data/bench/fusion_kernels_h100.md.
template <int PER>
__device__ __forceinline__ void topk_moe_reg(TV w, TV ids, TV x, int k, int softmax_first, int norm) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float chosen[64];
    __shared__ int chosen_id[64];
    const int n = x.n[3], lane = threadIdx.x & 31;
    const float* xf = (const float*)x.p;  // contiguous f32 logits (every router; the binding checks)
    float v[PER];
    unsigned gone = 0u;  // bit u: entry lane + 32 u is past the row or chosen already
#pragma unroll
    for (int u = 0; u < PER; ++u) gone |= (lane + 32 * u < n ? 0u : 1u) << u;
    PDL_WAIT(first_read);
    v[0] = lane < n ? *(const WB_FIRST_READ float*)(xf + lane) : -WB_INF;
    PDL_WAIT(late);
#pragma unroll
    for (int u = 1; u < PER; ++u) v[u] = (gone >> u) & 1u ? -WB_INF : xf[lane + 32 * u];
    float m = -WB_INF;
#pragma unroll
    for (int u = 0; u < PER; ++u) m = fmaxf(m, v[u]);
    PDL_TRIGGER(after_main_loop);
    if (softmax_first) {  // as the wide kernel: exp(x - max) / sum, entry by entry
        m = warp_max(m);
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            v[u] = (gone >> u) & 1u ? 0.0f : expf(v[u] - m);
            s += v[u];
        }
        const float inv = 1.0f / warp_sum(s);  // one division (llama.cpp's inv_sum), not PER
#pragma unroll
        for (int u = 0; u < PER; ++u) v[u] *= inv;
    }
    for (int r = 0; r < k; ++r) {
        // the lane's best untaken entry: a tree over its slots (depth log2 PER, not a chain of
        // PER compares: one warp runs alone, so each dependent step costs its full latency); the
        // left operand always holds the lower indices, so a tie keeps it (NumPy's stable order)
        float bv[PER];
        int bi[PER];
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            bv[u] = v[u];
            bi[u] = (gone >> u) & 1u ? -1 : lane + 32 * u;
        }
#pragma unroll
        for (int span = 1; span < PER; span *= 2) {
#pragma unroll
            for (int u = 0; u + span < PER; u += 2 * span) {
                if (bi[u + span] >= 0 && (bi[u] < 0 || bv[u + span] > bv[u])) {
                    bv[u] = bv[u + span];
                    bi[u] = bi[u + span];
                }
            }
        }
        float best = bv[0];
        int at = bi[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, at, o);
            if (better(ov, oi, best, at)) { best = ov; at = oi; }
        }
        if (at >= 0 && lane == (at & 31)) gone |= 1u << (at >> 5);
        if (lane == 0) { chosen[r] = best; chosen_id[r] = at; }
    }
    __syncwarp();
    topk_moe_finish(w, ids, chosen, chosen_id, k, softmax_first, norm);
    PDL_TRIGGER(end);
}

extern "C" __global__ void k_topk_moe(TV w, TV ids, TV x, int k, int softmax_first, int norm) {
    topk_moe_reg<4>(w, ids, x, k, softmax_first, norm);
}
extern "C" __global__ void k_topk_moe_512(TV w, TV ids, TV x, int k, int softmax_first, int norm) {
    topk_moe_reg<16>(w, ids, x, k, softmax_first, norm);
}

// k_topk_moe_wide: rows of n <= TOPK_MAXN, staged in shared memory (warp_top_k).
extern "C" __global__ void k_topk_moe_wide(TV w, TV ids, TV x, int k, int softmax_first, int norm) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float vals[TOPK_MAXN];
    __shared__ unsigned char taken[TOPK_MAXN];
    __shared__ float chosen[64];
    __shared__ int chosen_id[64];
    const int n = x.n[3], lane = threadIdx.x & 31;
    float m = stage_row(x, vals, taken, n);
    PDL_TRIGGER(after_main_loop);
    if (softmax_first) {  // each lane rescales the entries it staged
        m = warp_max(m);
        float s = 0.0f;
        for (int j = lane; j < n; j += 32) {
            vals[j] = expf(vals[j] - m);
            s += vals[j];
        }
        s = warp_sum(s);
        for (int j = lane; j < n; j += 32) vals[j] = vals[j] / s;
    }
    __syncwarp();
    warp_top_k(vals, taken, n, k, chosen, chosen_id);
    topk_moe_finish(w, ids, chosen, chosen_id, k, softmax_first, norm);
    PDL_TRIGGER(end);
}
