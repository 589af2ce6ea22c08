// ARGSORT_TOP_K of the MoE router: indices of the k largest of one row (n <= TOPK_MAXN), in
// descending order, ties to the lower index (NumPy's stable argsort of -x). One block: the row
// is staged in shared memory, then k rounds of a block arg-max over the untaken entries.
#include "common.cuh"

#define TOPK_MAXN 4096

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    return a > b || (a == b && ia < ib);
}

// d: [k] i32 (flat); x: one row on axis 3. block = 256 threads.
extern "C" __global__ void k_argsort_top_k(TV d, TV x, int k) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float vals[TOPK_MAXN];
    __shared__ unsigned char taken[TOPK_MAXN];
    __shared__ float wv[32];
    __shared__ int wi[32];
    const int n = x.n[3], tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    PDL_WAIT(first_read);
    const float first = tid < n ? ldf_v(x.p + (i64)tid * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    for (int j = tid; j < n; j += blockDim.x) {
        vals[j] = j == tid ? first : ldf(x.p + (i64)j * x.s[3], x.dt);
        taken[j] = 0;
    }
    __syncthreads();
    PDL_TRIGGER(after_main_loop);
    for (int r = 0; r < k; ++r) {
        float bv = -WB_INF;
        int bi = -1;
        for (int j = tid; j < n; j += blockDim.x)
            if (!taken[j] && better(vals[j], j, bv, bi)) { bv = vals[j]; bi = j; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { wv[warp] = bv; wi[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            float b = wv[0];
            int bidx = wi[0];
            for (int w = 1; w < nw; ++w)
                if (better(wv[w], wi[w], b, bidx)) { b = wv[w]; bidx = wi[w]; }
            stf(d.p + tv_off(d, d.n, r), d.dt, (float)bidx);
            taken[bidx] = 1;
        }
        __syncthreads();
    }
    PDL_TRIGGER(end);
}

// TOPK_MOE (the topk-moe fusion, llama.cpp's topk_moe_cuda): the MoE router chain in one block.
// x: the router logits (one row on axis 3, n <= TOPK_MAXN); w: the k weights, ids: the k expert
// ids (both flat). softmax_first: probabilities over all experts first (Qwen3), else a softmax
// over the k chosen logits (gpt-oss); norm: the chosen weights renormalised to sum to one.
extern "C" __global__ void k_topk_moe(TV w, TV ids, TV x, int k, int softmax_first, int norm) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float vals[TOPK_MAXN];
    __shared__ unsigned char taken[TOPK_MAXN];
    __shared__ float wv[32];
    __shared__ int wi[32];
    __shared__ float chosen[64];
    __shared__ int chosen_id[64];
    const int n = x.n[3], tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    PDL_WAIT(first_read);
    const float first = tid < n ? ldf_v(x.p + (i64)tid * x.s[3], x.dt) : 0.0f;
    PDL_WAIT(late);
    float m = -WB_INF;
    for (int j = tid; j < n; j += blockDim.x) {
        vals[j] = j == tid ? first : ldf(x.p + (i64)j * x.s[3], x.dt);
        taken[j] = 0;
        m = fmaxf(m, vals[j]);
    }
    PDL_TRIGGER(after_main_loop);
    if (softmax_first) {
        m = block_max(m);
        float s = 0.0f;
        for (int j = tid; j < n; j += blockDim.x) {
            vals[j] = expf(vals[j] - m);
            s += vals[j];
        }
        s = block_sum(s);
        for (int j = tid; j < n; j += blockDim.x) vals[j] = vals[j] / s;
    }
    __syncthreads();
    for (int r = 0; r < k; ++r) {
        float bv = -WB_INF;
        int bi = -1;
        for (int j = tid; j < n; j += blockDim.x)
            if (!taken[j] && better(vals[j], j, bv, bi)) { bv = vals[j]; bi = j; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { wv[warp] = bv; wi[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            float b = wv[0];
            int bidx = wi[0];
            for (int q = 1; q < nw; ++q)
                if (better(wv[q], wi[q], b, bidx)) { b = wv[q]; bidx = wi[q]; }
            chosen[r] = vals[bidx];
            chosen_id[r] = bidx;
            taken[bidx] = 1;
        }
        __syncthreads();
    }
    if (tid == 0) {
        if (!softmax_first) {  // softmax over the chosen logits
            float cm = -WB_INF, cs = 0.0f;
            for (int r = 0; r < k; ++r) cm = fmaxf(cm, chosen[r]);
            for (int r = 0; r < k; ++r) { chosen[r] = expf(chosen[r] - cm); cs += chosen[r]; }
            for (int r = 0; r < k; ++r) chosen[r] = chosen[r] / cs;
        }
        float total = 0.0f;
        for (int r = 0; r < k; ++r) total += chosen[r];
        for (int r = 0; r < k; ++r) {
            stf(w.p + tv_off(w, w.n, r), w.dt, norm ? chosen[r] / total : chosen[r]);
            stf(ids.p + tv_off(ids, ids.n, r), ids.dt, (float)chosen_id[r]);
        }
    }
    PDL_TRIGGER(end);
}
