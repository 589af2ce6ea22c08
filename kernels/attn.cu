// FLASH_ATTN_EXT for one decode token (flash-decoding): block (h, s) handles query head h over
// key chunk s with an online softmax per warp and merges its warps. A block that holds the
// whole context writes the output; otherwise it writes a partial (max, sum, acc[D]) to a
// per-node workspace and the last block of head h to finish (atomic ticket) merges the S
// partials in a fixed order (so the result does not depend on which block came last: graph
// replays are bit-identical), adds the attention sink when the model has one (gpt-oss), writes
// the output and resets the ticket for the next launch.
// Scores, maxima and sinks are kept in log2 units (scaled by log2 e as they are formed), so each
// exponential is one ex2.approx (MUFU.EX2) instead of expf's range reduction: a decode attention
// block is a latency-bound chain of instructions (ncu: data/bench/attn_diet_h100.md).
#include "common.cuh"

#define FA_LOG2E 1.4426950408889634f
// 2^x; 2^-inf = 0
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define FA_WARPS 4
#define FA_MAXD 256
#define FA_PER_LANE (FA_MAXD / 32)

template <int KDT>
__device__ __forceinline__ float ldk(const char* p) {
    if (KDT == DT_F16) return h2f(*(const u16*)p);
    if (KDT == DT_BF16) return bf2f(*(const u16*)p);
    return *(const float*)p;
}

// The last block of head h: merge the S partials (max, sum, acc[D]) in a fixed order, add the
// attention sink when the model has one, write the output. The partials are read from L2
// (ld.global.cg: other blocks wrote them; the ticket's fence orders those writes) in two round
// trips: the block's threads stride over the partials loading each (max, sum) pair once into
// shared memory (the global max and the sum then come from there), and each output element's
// loads over s are independent.
#define FA_COMBINE_S 512
__device__ __forceinline__ void fa_combine_partials(TV& d, int D, int h, int S, float sink, int has_sinks,
                                                    const float* ws) {
    __shared__ float wts[FA_COMBINE_S], sums[FA_COMBINE_S];
    const int tid = threadIdx.x, nt = blockDim.x;
    const float* base = ws + (i64)h * S * (D + 2);
    __syncthreads();  // a previous call's (the gqa kernel's previous head's) readers of wts are done
    float mx = -WB_INF;
    for (int s = tid; s < S; s += nt) {
        const float ms = __ldcg(base + (i64)s * (D + 2));
        if (s < FA_COMBINE_S) {
            wts[s] = ms;
            sums[s] = __ldcg(base + (i64)s * (D + 2) + 1);
        }
        mx = fmaxf(mx, ms);
    }
    const float Mg = fmaxf(block_max(mx), has_sinks ? sink : -WB_INF);  // block_max's barrier publishes both
    float lsum = 0.0f;
    for (int s = tid; s < S; s += nt) {
        const bool kept = s < FA_COMBINE_S;
        const float ms = kept ? wts[s] : __ldcg(base + (i64)s * (D + 2));
        const float w = ms == -WB_INF ? 0.0f : fa_exp2(ms - Mg);
        if (kept) wts[s] = w;
        lsum += w == 0.0f ? 0.0f : (kept ? sums[s] : __ldcg(base + (i64)s * (D + 2) + 1)) * w;
    }
    const float Lg = block_sum(lsum) + (has_sinks ? fa_exp2(sink - Mg) : 0.0f);  // block_sum's barrier publishes wts
    const float inv = 1.0f / Lg;
    for (int j = tid; j < D; j += nt) {
        float a = 0.0f;
#pragma unroll 8
        for (int s = 0; s < S; ++s) {
            float w;
            if (s < FA_COMBINE_S) {
                w = wts[s];
            } else {
                const float ms = __ldcg(base + (i64)s * (D + 2));
                w = ms == -WB_INF ? 0.0f : fa_exp2(ms - Mg);
            }
            if (w != 0.0f) a += __ldcg(base + (i64)s * (D + 2) + 2 + j) * w;
        }
        stf(d.p + tv_off(d, d.n, h * D + j), d.dt, a * inv);
    }
}

// Whether this block is the last of the S blocks that share ticket t. The block's partial writes
// (before the barrier) are released by thread 0's increment and acquired by the last block's
// (CUTLASS's semaphore: bar.sync, then one acq_rel atomic at GPU scope, then bar.sync): no
// __threadfence, which waits for every outstanding write of the thread.
__device__ __forceinline__ bool fa_last_block(int* t, int S) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(t) : "memory");
        last = old == S - 1;
    }
    __syncthreads();
    return last;
}

// Thread block clusters (sm_90): a head's S split blocks launched as one cluster (1, S, 1) merge
// their partials through distributed shared memory behind two cluster barriers instead of the
// workspace and the ticket (a GPU-scope atomic, then a second pass over L2). Launched without a
// cluster (an older GPU, or S past the cluster limit) the blocks read a cluster of one and take
// the ticket path.
__device__ __forceinline__ unsigned fa_cluster_size() {
#if __CUDA_ARCH__ >= 900
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
#else
    return 1;
#endif
}

#define FA_CLUSTER_MAX 8
// The block's transaction barrier (mbarrier) of the cluster merge: initialised with one arrival
// before the kernel's cluster arrive, completed when the block's own expect_tx has arrived and
// the bytes every block of the cluster pushes into it (st.async ... complete_tx) have landed.
// A barrier.cluster release would order the stores with a GPU-wide memory barrier instead
// (MEMBAR.ALL.GPU under ncu: data/bench/attn_diet_h100.md).
__device__ __forceinline__ unsigned fa_bar() {
    __shared__ alignas(8) unsigned long long bar;
    return (unsigned)__cvta_generic_to_shared(&bar);
}

__device__ __forceinline__ void fa_bar_init() {
#if __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(fa_bar()) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
}

// v stored at p (a __shared__ address of this block) as block `rank` of the cluster holds it,
// its 4 bytes counted by rank's barrier
__device__ __forceinline__ void fa_st_async(float* p, unsigned rank, float v) {
#if __CUDA_ARCH__ >= 900
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    unsigned r, b;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(fa_bar()), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(r), "r"(__float_as_uint(v)), "r"(b) : "memory");
#else
    *p = v;
#endif
}

// Thread 0 expects `bytes` on the block's barrier; every thread waits for its phase to complete.
__device__ __forceinline__ void fa_bar_wait(unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    const unsigned b = fa_bar();
    if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    asm volatile(
        "{\n"
        ".reg .pred P1;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%0], 0;\n"
        "@P1 bra DONE;\n"
        "bra WAIT;\n"
        "DONE:\n"
        "}\n" ::"r"(b) : "memory");
#endif
}

// The cluster barrier, arrived at the kernel's start (after fa_bar_init) and waited on before
// the merge's first remote store: by then every block of the cluster is running and its
// transaction barrier initialised, without a wait at the start.
__device__ __forceinline__ void fa_cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void fa_cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// A kernel that may merge in a cluster (fa_block_out) calls this first, in every thread.
__device__ __forceinline__ void fa_cluster_begin() {
    if (gridDim.y > 1 && fa_cluster_size() == gridDim.y) {
        fa_bar_init();
        fa_cluster_arrive();
    }
}

// The cluster's merge, by pushing: block s stores its (M, L) into every block and element j of
// its acc (scaled to M) into block j / slice's row s (st.async, counted by the receiving block's
// transaction barrier fa_bar); once its own barrier completes, block r merges output elements
// [r * slice, (r + 1) * slice) over the S rows in rank order (a fixed order: bit-identical
// replays), the sink in the normaliser, all from its own shared memory. Nothing is read remotely,
// and a block waits for every store into it before it exits. slice is the power of two from
// ceil(D / S) up (shifts, not divisions; the last ranks may own nothing). dh: the head's first
// output element, element j at dh + j * ds (fa_block_out). Requires fa_cluster_begin() at the
// kernel's start (the barriers initialised, the cluster barrier's arrive).
__device__ __forceinline__ void fa_cluster_merge(char* dh, int ddt, i64 ds, float M, float L, const float* wm,
                                                 const float (*acc)[FA_MAXD], int nw, int D, int S, float sink,
                                                 int has_sinks) {
    __shared__ float recv[2 * (FA_MAXD + FA_CLUSTER_MAX)], rml[2 * FA_CLUSTER_MAX];
    const int tid = threadIdx.x, me = blockIdx.y % S;
    int lgs = 0;
    while ((S << lgs) < D) ++lgs;
    const int slice = 1 << lgs;
    fa_cluster_wait();  // every block of the cluster has started (arrived at its start)
    for (int j = tid; j < D; j += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < nw; ++w)
            if (wm[w] != -WB_INF) a += acc[w][j] * fa_exp2(wm[w] - M);
        fa_st_async(&recv[me * slice + (j & (slice - 1))], j >> lgs, a);
    }
    if (tid < S) {
        fa_st_async(&rml[2 * me], tid, M);
        fa_st_async(&rml[2 * me + 1], tid, L);
    }
    // every block sends this one its (M, L) and the elements this one owns
    fa_bar_wait((unsigned)(S * (min(slice, max(0, D - me * slice)) + 2) * 4));
    // warp 0: lane s < S takes block s's (M, L); the global max, each block's weight and 1 / sum
    __shared__ float cw[FA_CLUSTER_MAX], cinv;
    if (tid < 32) {
        const float ms = tid < S ? rml[2 * tid] : -WB_INF, ls = tid < S ? rml[2 * tid + 1] : 0.0f;
        const float Mg = fmaxf(warp_max(ms), has_sinks ? sink : -WB_INF);
        const float w = ms == -WB_INF ? 0.0f : fa_exp2(ms - Mg);
        const float Lg = warp_sum(w == 0.0f ? 0.0f : ls * w) + (has_sinks ? fa_exp2(sink - Mg) : 0.0f);
        if (tid < S) cw[tid] = w;
        if (tid == 0) cinv = 1.0f / Lg;
    }
    __syncthreads();
    const int j = me * slice + tid;
    if (tid < slice && j < D) {  // slice <= D / 2 <= blockDim.x: one element a thread
        float a = 0.0f;
        for (int s = 0; s < S; ++s)
            if (cw[s] != 0.0f) a += recv[s * slice + tid] * cw[s];
        stf(dh + (i64)j * ds, ddt, a * cinv);
    }
}

// The block's warps merged (in a fixed order) into its (M, L, acc[D]) at the block max M, from
// each warp's max wm, sum wl and accumulator acc (shared memory). With S == 1 the block held
// the whole context: it writes the output (the sink in the normaliser); otherwise its partial
// goes to the workspace and the head's last block merges all S, or, launched as a cluster of
// the S blocks, the cluster merges them (fa_cluster_merge). d's innermost axis holds whole heads
// (the host checks it), so head h's output is D elements d.s[3] apart from one offset.
__device__ __forceinline__ void fa_block_out(TV& d, const float* wm, const float* wl, const float (*acc)[FA_MAXD],
                                             int nw, int D, int h, int sidx, int S, float sink, int has_sinks,
                                             float* ws, int* tickets) {
    const int tid = threadIdx.x;
    float M = -WB_INF, L = 0.0f;
    for (int w = 0; w < nw; ++w) M = fmaxf(M, wm[w]);
    for (int w = 0; w < nw; ++w)
        if (wm[w] != -WB_INF) L += wl[w] * fa_exp2(wm[w] - M);
    char* dh = d.p + tv_off(d, d.n, h * D);
    if (S > 1 && (int)fa_cluster_size() == S) {
        fa_cluster_merge(dh, d.dt, d.s[3], M, L, wm, acc, nw, D, S, sink, has_sinks);
        return;
    }
    float out_scale = 1.0f;
    if (S == 1) {
        const float Mg = fmaxf(M, has_sinks ? sink : -WB_INF);
        const float wblk = M == -WB_INF ? 0.0f : fa_exp2(M - Mg);
        out_scale = wblk / (L * wblk + (has_sinks ? fa_exp2(sink - Mg) : 0.0f));
    }
    float* part = ws + ((i64)h * S + sidx) * (D + 2);
    for (int j = tid; j < D; j += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < nw; ++w)
            if (wm[w] != -WB_INF) a += acc[w][j] * fa_exp2(wm[w] - M);
        if (S == 1)
            stf(dh + (i64)j * d.s[3], d.dt, a * out_scale);
        else
            part[2 + j] = a;
    }
    if (S == 1) return;
    if (tid == 0) {
        part[0] = M;
        part[1] = L;
    }
    if (fa_last_block(&tickets[h], S)) {
        fa_combine_partials(d, D, h, S, sink, has_sinks, ws);
        if (tid == 0) tickets[h] = 0;
    }
}

// q: [H, D] (axes 2..3); k, v: [n_kv, H_kv, D] (axes 1..3); mask: [n_kv] (axis 3);
// sinks: [H] (axis 3) when has_sinks; d: flat [H * D]. grid = (H, S), block = 32 * FA_WARPS.
// ws: H * S * (D + 2) floats; tickets: H ints, zero between launches.
template <int KDT>
__device__ __forceinline__ void flash_attn_decode(TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale,
                                                  int has_sinks, float* ws, int* tickets) {
    fa_cluster_begin();  // fa_block_out's cluster merge completes this barrier phase
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    __shared__ float qs[FA_MAXD];
    __shared__ float wm[FA_WARPS], wl[FA_WARPS];
    __shared__ float wacc[FA_WARPS][FA_MAXD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x, sidx = blockIdx.y, S = gridDim.y;
    const int H = q.n[2], D = q.n[3], n_kv = k.n[1], Hkv = k.n[2];
    const int g = h / (H / Hkv);
    const int chunk = (n_kv + S - 1) / S;
    const int t0 = sidx * chunk, t1 = min(n_kv, t0 + chunk);
    const float sink = has_sinks ? ldf(sinks.p + (i64)h * sinks.s[3], sinks.dt) * FA_LOG2E : 0.0f;  // a weight
    scale *= FA_LOG2E;
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
        const float mk = ldf(mask.p + (i64)t * mask.s[3], mask.dt) * FA_LOG2E;
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
        const float corr = fa_exp2(m - mn), e = fa_exp2(s - mn);
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
    PDL_TRIGGER(after_main_loop);
    __syncthreads();
    fa_block_out(d, wm, wl, wacc, FA_WARPS, D, h, sidx, S, sink, has_sinks, ws, tickets);
    PDL_TRIGGER(end);
}

// The vectorized variant (the one decode steps use): keys are read as 16-byte pieces, LPK lanes
// per key (a K or V row of D elements is P = D * itemsize / 16 pieces, P <= 32), so a warp reads
// 32 / LPK rows per instruction, coalesced per row. A round issues every K and V load of its
// `steps` steps of NW * KPW keys (NW = blockDim.x / 32 warps, up to FAV_MAXW) before any of it is
// used; each warp keeps its own online softmax (max, sum, V accumulated per lane) across the
// block's `rounds` rounds, and the warps are merged once at the end. grid = (H, S), block =
// 32 * NW; block s takes keys [s * rounds * chunk, (s + 1) * rounds * chunk), chunk = NW * KPW *
// steps. With S == 1 (the host's choice whenever a head's keys fit a few rounds: a short context)
// the block writes the output itself; otherwise its partial goes to the workspace and the last
// block of the head merges them: that merge (an acq_rel ticket and a second pass over
// L2) costs more than a round of loads, so the host prefers rounds to splits.
#define FAV_WARPS 4
#define FAV_MAXW 16
#define FAV_STEPS 8

struct alignas(16) fa_u4 { u32 x, y, z, w; };

__device__ __forceinline__ fa_u4 fa_ld16(const char* p) {
    fa_u4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// element e of a 16-byte piece as float
template <int KDT>
__device__ __forceinline__ float fa_el(const fa_u4& v, int e) {
    u32 word;
    if (KDT == DT_F32) {
        word = e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
        return __uint_as_float(word);
    }
    const int wi = e >> 1;
    word = wi == 0 ? v.x : wi == 1 ? v.y : wi == 2 ? v.z : v.w;
    const u16 h = (e & 1) ? (u16)(word >> 16) : (u16)(word & 0xffffu);
    return KDT == DT_F16 ? h2f(h) : bf2f(h);
}

// One round's K, V and mask loads of a block of nw warps (16-byte pieces, issued before any is
// used): in step st, warp w's key slot sub reads key t0 + (st * nw + w) * kpw + sub; zeros and a
// -inf mask past the keys or past the round's steps.
__device__ __forceinline__ void fa_load_round(fa_u4 (&kv)[FAV_STEPS], fa_u4 (&vv)[FAV_STEPS], float (&mk)[FAV_STEPS],
                                              const char* kb, const char* vb, const TV& k, const TV& v,
                                              const TV& mask, int t0, int nw, int warp, int kpw, int sub,
                                              int steps, int n_kv) {
#pragma unroll
    for (int st = 0; st < FAV_STEPS; ++st) {
        const int t = t0 + (st * nw + warp) * kpw + sub;
        const bool ok = st < steps && t < n_kv;
        kv[st] = ok ? fa_ld16(kb + (i64)t * k.s[1]) : fa_u4{0u, 0u, 0u, 0u};
        vv[st] = ok ? fa_ld16(vb + (i64)t * v.s[1]) : fa_u4{0u, 0u, 0u, 0u};
        mk[st] = ok ? ldf(mask.p + (i64)t * mask.s[3], mask.dt) : -WB_INF;
    }
}

// A block is a latency-bound chain of instructions (ncu: data/bench/attn_diet_h100.md), so the
// lane split is shifts (P = 2^lg pieces a row, a power of two: the host), the reductions over a
// key's lanes are unrolled shuffles under a uniform predicate, the loads' addresses advance by one
// stride a step from per-lane bases computed once (no per-step 64-bit index math), the mask is
// read as f32 (the host checks it) and the only division is h's KV head.
template <int KDT>
__device__ __forceinline__ void flash_attn_decode_vec(TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale,
                                                      int has_sinks, float* ws, int* tickets, int steps,
                                                      int rounds) {
    fa_cluster_begin();  // fa_block_out's cluster merge completes this barrier phase
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int EPL = KDT == DT_F32 ? 4 : 8;  // elements per 16-byte piece
    const int lg = 31 - __clz(q.n[3] / EPL), P = 1 << lg, KPW = 32 >> lg;
    __shared__ float qs[FA_MAXD];
    __shared__ float wm[FAV_MAXW], wl[FAV_MAXW];
    __shared__ float accs[FAV_MAXW][FA_MAXD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NW = blockDim.x >> 5;
    const int h = blockIdx.x, sidx = blockIdx.y, S = gridDim.y;
    const int H = q.n[2], D = q.n[3], n_kv = k.n[1], Hkv = k.n[2];
    const int sub = lane >> lg, pl = lane & (P - 1);
    const int g = h * Hkv / H;  // h / (H / Hkv)
    const int tstep = NW * KPW, chunk = tstep * steps;
    const int tl = warp * KPW + sub;  // this lane's key within a step
    const int t0 = sidx * rounds * chunk;
    const float sink = has_sinks ? ldf(sinks.p + (i64)h * sinks.s[3], sinks.dt) * FA_LOG2E : 0.0f;  // a weight
    scale *= FA_LOG2E;
    const char* qr = q.p + (i64)h * q.s[2];
    const char* kb = k.p + (i64)g * k.s[2] + (i64)pl * 16 + (i64)tl * k.s[1];
    const char* vb = v.p + (i64)g * v.s[2] + (i64)pl * 16 + (i64)tl * v.s[1];
    const char* mb = mask.p + (i64)tl * mask.s[3];
    const i64 kst = (i64)tstep * k.s[1], vst = (i64)tstep * v.s[1], mst = (i64)tstep * mask.s[3];
    PDL_WAIT(first_read);
    const float q0 = tid < D ? ldf_v(qr + (i64)tid * q.s[3], q.dt) : 0.0f;
    PDL_WAIT(late);
    fa_u4 kv[FAV_STEPS], vv[FAV_STEPS];
    float mk[FAV_STEPS];
    // one round's K, V and mask loads (keys tr + tl + st * tstep), all issued before any is used
    auto load = [&](int tr) {
        const char* kp = kb + (i64)tr * k.s[1];
        const char* vp = vb + (i64)tr * v.s[1];
        const char* mp = mb + (i64)tr * mask.s[3];
        const int left = n_kv - tr - tl;  // step st reads a key while st * tstep < left
#pragma unroll
        for (int st = 0; st < FAV_STEPS; ++st) {
            const bool ok = st < steps && st * tstep < left;
            kv[st] = ok ? fa_ld16(kp) : fa_u4{0u, 0u, 0u, 0u};
            vv[st] = ok ? fa_ld16(vp) : fa_u4{0u, 0u, 0u, 0u};
            mk[st] = ok ? *(const float*)mp : -WB_INF;  // in natural units: scaled where used
            kp += kst;
            vp += vst;
            mp += mst;
        }
    };
    load(t0);  // the first round's loads are in flight while q is staged
    for (int j = tid; j < D; j += blockDim.x) qs[j] = j == tid ? q0 : ldf(qr + (i64)j * q.s[3], q.dt);
    __syncthreads();
    float qp[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) qp[e] = qs[pl * EPL + e];
    // this warp's online softmax: running max m (warp-uniform), sum l (one lane per key slot), acc
    float m = -WB_INF, l = 0.0f, acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] = 0.0f;
    for (int r = 0; r < rounds; ++r) {
        if (r > 0) load(t0 + r * chunk);
        float sc[FAV_STEPS];
        float mr = -WB_INF;
#pragma unroll
        for (int st = 0; st < FAV_STEPS; ++st) {
            float p = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) p = fmaf(qp[e], fa_el<KDT>(kv[st], e), p);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                if (o < P) p += __shfl_xor_sync(0xffffffffu, p, o);
            sc[st] = mk[st] != -WB_INF ? fmaf(mk[st], FA_LOG2E, p * scale) : -WB_INF;  // masked or past the keys
            mr = fmaxf(mr, sc[st]);
        }
        const float mn = fmaxf(m, warp_max(mr));
        if (mn == -WB_INF) continue;  // every key of this warp so far masked (uniform over the warp)
        const float corr = fa_exp2(m - mn);  // 0 while m is -inf
        l *= corr;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[e] *= corr;
#pragma unroll
        for (int st = 0; st < FAV_STEPS; ++st) {
            const float p = fa_exp2(sc[st] - mn);  // 0 for a masked key
            if (pl == 0) l += p;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[e] = fmaf(p, fa_el<KDT>(vv[st], e), acc[e]);
        }
        m = mn;
    }
    PDL_TRIGGER(after_main_loop);
    l = warp_sum(l);
    // reduce acc over the key slots of the warp (lanes with the same piece)
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        if (o >= P)
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
    if (sub == 0)
#pragma unroll
        for (int e = 0; e < EPL; ++e) accs[warp][pl * EPL + e] = acc[e];
    __syncthreads();
    fa_block_out(d, wm, wl, accs, NW, D, h, sidx, S, sink, has_sinks, ws, tickets);
    PDL_TRIGGER(end);
}

// The GQA-shared variant of the vectorized kernel: block (g, s) takes key chunk s of KV head g
// for all G = H / H_kv query heads that read it, so each K and V piece is loaded from memory
// once per group instead of once per query head (the loads sit in registers, as above, and every
// head of the group reuses them). Per head: scores, block softmax statistics and P.V as in
// flash_attn_decode_vec, its partial written to the workspace row (h, s). The last block of the
// group (one ticket per KV head) merges the S partials of each of its heads. grid = (H_kv, S),
// block = 32 * FAV_WARPS; chunk and S as for k_flash_attn_ext_vec_* (host: smaller chunks, since
// there are G times fewer blocks). q of the group staged in shared memory: G * D <= FAG_MAXQ,
// G <= FAG_MAXG (the group's sinks, read before the trigger like every graph view).
#define FAG_MAXQ 2048
#define FAG_MAXG 64

template <int KDT>
__device__ __forceinline__ void flash_attn_decode_gqa(TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale,
                                                      int has_sinks, float* ws, int* tickets, int steps) {
    PDL_TRIGGER(start);
    PDL_WAIT(start);
    constexpr int EPL = KDT == DT_F32 ? 4 : 8;
    scale *= FA_LOG2E;
    __shared__ float qs[FAG_MAXQ];
    __shared__ float sks[FAG_MAXG];
    __shared__ float red[FAV_WARPS];
    __shared__ float accs[FAV_WARPS][FA_MAXD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.x, sidx = blockIdx.y, S = gridDim.y;
    const int H = q.n[2], D = q.n[3], n_kv = k.n[1], Hkv = k.n[2], G = H / Hkv;
    const int P = D / EPL, LPK = P, KPW = 32 / LPK;
    const int sub = lane / LPK, pl = lane % LPK;
    const int chunk = FAV_WARPS * KPW * steps;
    const int t0 = sidx * chunk;
    const char* kb = k.p + (i64)g * k.s[2] + (i64)pl * 16;
    const char* vb = v.p + (i64)g * v.s[2] + (i64)pl * 16;
    const char* qg = q.p + (i64)g * G * q.s[2];
    PDL_WAIT(first_read);
    const float q0 = tid < D ? ldf_v(qg + (i64)tid * q.s[3], q.dt) : 0.0f;
    PDL_WAIT(late);
    fa_u4 kv[FAV_STEPS], vv[FAV_STEPS];
    float mk[FAV_STEPS];
    fa_load_round(kv, vv, mk, kb, vb, k, v, mask, t0, FAV_WARPS, warp, KPW, sub, steps, n_kv);
    for (int j = tid; j < G * D; j += blockDim.x) {
        const int hh = j / D, e = j % D;
        qs[j] = j == tid && hh == 0 ? q0 : ldf(qg + (i64)hh * q.s[2] + (i64)e * q.s[3], q.dt);
    }
    for (int j = tid; j < G; j += blockDim.x)  // a weight
        sks[j] = has_sinks ? ldf(sinks.p + (i64)(g * G + j) * sinks.s[3], sinks.dt) * FA_LOG2E : 0.0f;
    __syncthreads();
    for (int hh = 0; hh < G; ++hh) {
        const int h = g * G + hh;
        float sc[FAV_STEPS];
        float m = -WB_INF;
#pragma unroll
        for (int st = 0; st < FAV_STEPS; ++st) {
            float p = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) p = fmaf(qs[hh * D + pl * EPL + e], fa_el<KDT>(kv[st], e), p);
            for (int o = LPK >> 1; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
            sc[st] = mk[st] != -WB_INF ? fmaf(mk[st], FA_LOG2E, p * scale) : -WB_INF;
            m = fmaxf(m, sc[st]);
        }
        m = warp_max(m);
        if (lane == 0) red[warp] = m;
        __syncthreads();
        m = -WB_INF;
        for (int w = 0; w < FAV_WARPS; ++w) m = fmaxf(m, red[w]);
        __syncthreads();
        float l = 0.0f, acc[EPL];
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[e] = 0.0f;
#pragma unroll
        for (int st = 0; st < FAV_STEPS; ++st) {
            const float p = (m == -WB_INF || sc[st] == -WB_INF) ? 0.0f : fa_exp2(sc[st] - m);
            if (pl == 0) l += p;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[e] = fmaf(p, fa_el<KDT>(vv[st], e), acc[e]);
        }
        l = warp_sum(l);
        if (lane == 0) red[warp] = l;
        for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
        if (sub == 0)
#pragma unroll
            for (int e = 0; e < EPL; ++e) accs[warp][pl * EPL + e] = acc[e];
        __syncthreads();
        float* part = ws + ((i64)h * S + sidx) * (D + 2);
        for (int j = tid; j < D; j += blockDim.x) {
            float a = 0.0f;
            for (int w = 0; w < FAV_WARPS; ++w) a += accs[w][j];
            part[2 + j] = a;
        }
        if (tid == 0) {
            float lb = 0.0f;
            for (int w = 0; w < FAV_WARPS; ++w) lb += red[w];
            part[0] = m;
            part[1] = lb;
        }
        __syncthreads();  // red / accs are the next head's
    }
    PDL_TRIGGER(after_main_loop);
    if (fa_last_block(&tickets[g], S)) {
        for (int hh = 0; hh < G; ++hh) fa_combine_partials(d, D, g * G + hh, S, sks[hh], has_sinks, ws);
        if (tid == 0) tickets[g] = 0;
    }
    PDL_TRIGGER(end);
}

#define FAV_ARGS TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale, int has_sinks, float *ws, int *tickets, int steps
#define FAV_PASS d, q, k, v, mask, sinks, scale, has_sinks, ws, tickets, steps
#define FAVR_ARGS FAV_ARGS, int rounds
#define FAVR_PASS FAV_PASS, rounds
extern "C" __global__ void __launch_bounds__(32 * FAV_MAXW) k_flash_attn_ext_vec_f16(FAVR_ARGS) { flash_attn_decode_vec<DT_F16>(FAVR_PASS); }
extern "C" __global__ void __launch_bounds__(32 * FAV_MAXW) k_flash_attn_ext_vec_bf16(FAVR_ARGS) { flash_attn_decode_vec<DT_BF16>(FAVR_PASS); }
extern "C" __global__ void __launch_bounds__(32 * FAV_MAXW) k_flash_attn_ext_vec_f32(FAVR_ARGS) { flash_attn_decode_vec<DT_F32>(FAVR_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_gqa_f16(FAV_ARGS) { flash_attn_decode_gqa<DT_F16>(FAV_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_gqa_bf16(FAV_ARGS) { flash_attn_decode_gqa<DT_BF16>(FAV_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_gqa_f32(FAV_ARGS) { flash_attn_decode_gqa<DT_F32>(FAV_PASS); }

#define FA_ARGS TV d, TV q, TV k, TV v, TV mask, TV sinks, float scale, int has_sinks, float *ws, int *tickets
#define FA_PASS d, q, k, v, mask, sinks, scale, has_sinks, ws, tickets
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_f16(FA_ARGS) { flash_attn_decode<DT_F16>(FA_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_bf16(FA_ARGS) { flash_attn_decode<DT_BF16>(FA_PASS); }
extern "C" __global__ void __launch_bounds__(128) k_flash_attn_ext_f32(FA_ARGS) { flash_attn_decode<DT_F32>(FA_PASS); }
