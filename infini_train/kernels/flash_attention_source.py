"""The CUDA C of the tensor-core attention kernels (FlashAttention-2's algorithm) for bfloat16 and float16 q, k, v
(role X) of head dim 64 or 128, sm_80 and later: ``mma.sync`` m16n8k16 products with float32 sums, ``ldmatrix``
operands, ``cp.async`` tiles. Launched by flash_attention.py; reference/flash_attention.py is the same arithmetic
in NumPy.

Forward (one block of 4 warps per 64 query rows of one head; each warp owns 16 rows): per 64-key step
S = q k^T (float32), masked (causal, sliding window, past the keys) to -inf, scaled; the running row max m and the
per-thread partial row sums l (each of the 4 threads of a row holds a quarter of its columns) are rescaled by
exp(m_old - m_new); P = exp(S - m) rounded to X (dropped weights zeroed after the sums) times v is added to the
rescaled output. At the end the four partial sums are added ((l0 + l1) + (l2 + l3)), out = acc / l (times
1 / (1 - p) under dropout) and lse = m + log l (+inf for a row that saw no key; its output is zero).

Backward, without atomics (every sum in a fixed order): ``attention_backward_dot`` gives D = rowsum(dO * O);
``attention_backward_dq`` (per 64 query rows, 32-key steps) recomputes P = exp(S - lse) and dP = dO v^T and adds
dS k, dS = P * (dropout'(dP) - D) rounded to X; ``attention_backward_dkdv`` (per 64 keys, 32-query steps, over every
query head of a key/value head: grouped-query attention sums there) computes S^T and dP^T with the keys as rows and
adds P^T dO (dV) and dS^T q (dK). dQ and dK are scaled at the end, dV by 1 / (1 - p) under dropout.
"""
from __future__ import annotations

from .cuda_source import register

SOURCE = register("flash_attention", ("X",), r"""
#if defined(X_IS_BFLOAT16)
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif
#define WARPS 4
#define THREADS 128
#define ROWS 64      // query rows (forward, dq) or keys (dk dv) per block: 16 per warp
#define FWD_KEYS 64  // keys per step of the forward
#define BWD_STEP 32  // keys (dq) or queries (dk dv) per step of the backward
#define FULL_MASK 0xffffffffu
#define POS_INF __int_as_float(0x7f800000)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned smem_address(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes from global to shared memory; past the rows' end nothing is read and zeros are written (src-size 0)
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_address(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// rows [row0, row0 + TILE) of a matrix of `rows` rows of D elements, row_stride apart, into a tile whose rows are
// D + 8 elements apart (the padding spreads ldmatrix's eight row reads over all banks)
template <int D, int TILE>
__device__ __forceinline__ void load_tile(unsigned short* tile, const X_t* src, long long row_stride, int row0,
                                          int rows) {
    constexpr int CHUNKS = D / 8;
    for (int c = threadIdx.x; c < TILE * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = row0 + r < rows;
        copy16_async(tile + r * (D + 8) + col, valid ? src + (long long)(row0 + r) * row_stride + col : src, valid);
    }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

// the A operand (16 x 16, row-major): tile rows [row0, row0 + 16), columns [col0, col0 + 16)
template <int D>
__device__ __forceinline__ void load_a(unsigned* a, const unsigned short* tile, int row0, int col0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4(a, tile + (row0 + (lane & 15)) * (D + 8) + col0 + (lane >> 4) * 8);
}
// B operands of two n-tiles whose n runs along the tile's rows [n0, n0 + 16) and k along its columns [k0, k0 + 16):
// b[0], b[1] for n0 .. n0 + 7, b[2], b[3] for n0 + 8 .. n0 + 15
template <int D>
__device__ __forceinline__ void load_b(unsigned* b, const unsigned short* tile, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * (D + 8) + k0 + ((lane >> 3) & 1) * 8);
}
// the same where k runs along the tile's rows [k0, k0 + 16) and n along its columns [n0, n0 + 16)
template <int D>
__device__ __forceinline__ void load_b_trans(unsigned* b, const unsigned short* tile, int k0, int n0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4_trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * (D + 8) + n0 + (lane >> 4) * 8);
}

// c += a b for one 16 x 8 tile: thread (g = lane / 4, t = lane % 4) holds c at rows g, g + 8, columns 2t, 2t + 1
__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
    return ((unsigned)STORE_X(hi) << 16) | (unsigned)STORE_X(lo);
}

// float32 results of two adjacent 8-column tiles as the A operand of the next product (columns become k)
__device__ __forceinline__ void as_operand(unsigned* a, const float* left, const float* right) {
    a[0] = pack(left[0], left[1]);
    a[1] = pack(left[2], left[3]);
    a[2] = pack(right[0], right[1]);
    a[3] = pack(right[2], right[3]);
}

__device__ __forceinline__ bool visible(int query, int key, int keys, int causal, int window) {
    return key < keys && (!causal || key <= query) && (window <= 0 || key > query - window);
}

// attention_dropout.py's mask: splitmix64 of the weight's flat (batch * heads, tq, tk) index
__device__ __forceinline__ bool keep(unsigned long long seed_mix, unsigned long long threshold, long long bh, int tq,
                                     int tk, int query, int key) {
    unsigned long long z = ((unsigned long long)bh * (unsigned long long)tq + (unsigned long long)query)
                           * (unsigned long long)tk + (unsigned long long)key;
    z += seed_mix;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 11) >= threshold;
}

// the keys [begin, end) a block of query rows [q0, q0 + ROWS) visits, begin a multiple of step
__device__ __forceinline__ void key_range(int q0, int keys, int causal, int window, int step, int* begin, int* end) {
    *end = causal && q0 + ROWS < keys ? q0 + ROWS : keys;
    *begin = window > 0 && q0 - window + 1 > 0 ? (q0 - window + 1) / step * step : 0;
}

// the queries [begin, end) that see a block of keys [k0, k0 + ROWS), begin a multiple of step
__device__ __forceinline__ void query_range(int k0, int queries, int causal, int window, int step, int* begin,
                                            int* end) {
    *begin = causal ? k0 / step * step : 0;
    *end = window > 0 && k0 + ROWS - 1 + window < queries ? k0 + ROWS - 1 + window : queries;
}

#define ATTENTION_ARGS                                                                                            \
    const X_t *q, const X_t *k, const X_t *v, long long q_b, long long q_h, long long q_t, long long k_b,         \
    long long k_h, long long k_t, long long v_b, long long v_h, long long v_t, int heads, int group, int tq,       \
    int tk, float scale, int causal, int window, unsigned long long seed_mix, unsigned long long threshold,       \
    float rescale
#define ATTENTION_PASS q, k, v, q_b, q_h, q_t, k_b, k_h, k_t, v_b, v_h, v_t, heads, group, tq, tk, scale, causal, \
    window, seed_mix, threshold, rescale

template <int D>
__device__ __forceinline__ void attention_forward(ATTENTION_ARGS, X_t* out, float* lse) {
    constexpr int KT = D / 16, NT = FWD_KEYS / 8, DT = D / 8;
    __shared__ __align__(16) unsigned short k_tile[FWD_KEYS * (D + 8)];
    __shared__ __align__(16) unsigned short v_tile[FWD_KEYS * (D + 8)];  // the queries pass through it first
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ROWS;
    const long long bh = (long long)b * heads + h;
    const bool dropout = threshold != 0ull;
    const X_t* ks = k + b * k_b + (h / group) * k_h;
    const X_t* vs = v + b * v_b + (h / group) * v_h;
    int k_begin, k_end;
    key_range(q0, tk, causal, window, FWD_KEYS, &k_begin, &k_end);

    load_tile<D, ROWS>(v_tile, q + b * q_b + h * q_h, q_t, q0, tq);
    copy_commit();
    if (k_begin < k_end) load_tile<D, FWD_KEYS>(k_tile, ks, k_t, k_begin, tk);
    copy_commit();
    copy_wait<1>();
    __syncthreads();
    unsigned qa[KT][4];
    for (int kt = 0; kt < KT; ++kt) load_a<D>(qa[kt], v_tile, warp * 16, kt * 16);
    __syncthreads();

    float acc[DT][4];
    for (int d = 0; d < DT; ++d) for (int e = 0; e < 4; ++e) acc[d][e] = 0.0f;
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.0f, 0.0f};
    for (int k0 = k_begin; k0 < k_end; k0 += FWD_KEYS) {
        load_tile<D, FWD_KEYS>(v_tile, vs, v_t, k0, tk);
        copy_commit();
        copy_wait<1>();  // this step's keys
        __syncthreads();
        float s[NT][4];
        for (int j = 0; j < NT; ++j) for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
        for (int kt = 0; kt < KT; ++kt) {
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bk[4];
                load_b<D>(bk, k_tile, np * 16, kt * 16);
                mma(s[2 * np], qa[kt], bk[0], bk[1]);
                mma(s[2 * np + 1], qa[kt], bk[2], bk[3]);
            }
        }
        float block_max[2] = {NEG_INF, NEG_INF};
        for (int j = 0; j < NT; ++j) {
            for (int e = 0; e < 4; ++e) {
                const int query = q0 + warp * 16 + g + 8 * (e >> 1), key = k0 + 8 * j + 2 * t + (e & 1);
                s[j][e] = visible(query, key, tk, causal, window) ? s[j][e] * scale : NEG_INF;
                block_max[e >> 1] = fmaxf(block_max[e >> 1], s[j][e]);
            }
        }
        float safe_max[2], correction[2];
        for (int r = 0; r < 2; ++r) {
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(FULL_MASK, block_max[r], 1));
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(FULL_MASK, block_max[r], 2));
            const float new_max = fmaxf(row_max[r], block_max[r]);
            safe_max[r] = new_max == NEG_INF ? 0.0f : new_max;  // a row with no key seen so far
            correction[r] = expf(row_max[r] - safe_max[r]);
            row_max[r] = new_max;
            row_sum[r] *= correction[r];
        }
        for (int j = 0; j < NT; ++j) {
            for (int e = 0; e < 4; ++e) {
                s[j][e] = expf(s[j][e] - safe_max[e >> 1]);
                row_sum[e >> 1] += s[j][e];
            }
        }
        if (dropout) {  // the sums keep every weight; the product with v only the kept ones
            for (int j = 0; j < NT; ++j) {
                for (int e = 0; e < 4; ++e) {
                    const int query = q0 + warp * 16 + g + 8 * (e >> 1), key = k0 + 8 * j + 2 * t + (e & 1);
                    if (!keep(seed_mix, threshold, bh, tq, tk, query, key)) s[j][e] = 0.0f;
                }
            }
        }
        unsigned pa[FWD_KEYS / 16][4];
        for (int kk = 0; kk < FWD_KEYS / 16; ++kk) as_operand(pa[kk], s[2 * kk], s[2 * kk + 1]);
        for (int d = 0; d < DT; ++d) for (int e = 0; e < 4; ++e) acc[d][e] *= correction[e >> 1];
        copy_wait<0>();  // this step's values
        __syncthreads();
        if (k0 + FWD_KEYS < k_end) load_tile<D, FWD_KEYS>(k_tile, ks, k_t, k0 + FWD_KEYS, tk);
        copy_commit();
        for (int kk = 0; kk < FWD_KEYS / 16; ++kk) {
            for (int dp = 0; dp < DT / 2; ++dp) {
                unsigned bv[4];
                load_b_trans<D>(bv, v_tile, kk * 16, dp * 16);
                mma(acc[2 * dp], pa[kk], bv[0], bv[1]);
                mma(acc[2 * dp + 1], pa[kk], bv[2], bv[3]);
            }
        }
        __syncthreads();
    }
    for (int r = 0; r < 2; ++r) {  // the four quarters of each row sum: (l0 + l1) + (l2 + l3)
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 2);
    }
    for (int r = 0; r < 2; ++r) {
        const int query = q0 + warp * 16 + g + 8 * r;
        if (query >= tq) continue;
        const float l = row_sum[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        X_t* o = out + (bh * tq + query) * D;
        for (int d = 0; d < DT; ++d) {
            float o0 = acc[d][2 * r] * inv, o1 = acc[d][2 * r + 1] * inv;
            if (dropout) { o0 *= rescale; o1 *= rescale; }
            *(unsigned*)(o + 8 * d + 2 * t) = pack(o0, o1);
        }
        if (t == 0) lse[bh * tq + query] = l > 0.0f ? row_max[r] + logf(l) : POS_INF;
    }
}

// dot[r] = sum over the head dim of dout * out, one warp per row r of the (batch * heads * tq) rows
extern "C" __global__ void __launch_bounds__(THREADS) attention_backward_dot(
        const X_t* dout, long long do_b, long long do_h, long long do_t, const X_t* out, float* dot, int heads,
        int tq, long long rows, int dim) {
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // the warp leaves as a whole
    const long long bh = row / tq;
    const X_t* gr = dout + (bh / heads) * do_b + (bh % heads) * do_h + (row % tq) * do_t;
    const X_t* orow = out + row * dim;
    float s = 0.0f;
    for (int c = lane; c < dim; c += 32) s += LOAD_X(gr[c]) * LOAD_X(orow[c]);
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(FULL_MASK, s, m);
    if (lane == 0) dot[row] = s;
}

template <int D>
__device__ __forceinline__ void attention_backward_dq(ATTENTION_ARGS, const X_t* dout, long long do_b,
                                                      long long do_h, long long do_t, const float* lse,
                                                      const float* dot, X_t* dq) {
    constexpr int KT = D / 16, NT = BWD_STEP / 8, DT = D / 8;
    __shared__ __align__(16) unsigned short tile_a[ROWS * (D + 8)];  // the queries, then each step's keys
    __shared__ __align__(16) unsigned short tile_b[ROWS * (D + 8)];  // the output gradients, then the values
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ROWS;
    const long long bh = (long long)b * heads + h;
    const bool dropout = threshold != 0ull;
    const X_t* ks = k + b * k_b + (h / group) * k_h;
    const X_t* vs = v + b * v_b + (h / group) * v_h;

    load_tile<D, ROWS>(tile_a, q + b * q_b + h * q_h, q_t, q0, tq);
    load_tile<D, ROWS>(tile_b, dout + b * do_b + h * do_h, do_t, q0, tq);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    unsigned qa[KT][4], ga[KT][4];
    for (int kt = 0; kt < KT; ++kt) {
        load_a<D>(qa[kt], tile_a, warp * 16, kt * 16);
        load_a<D>(ga[kt], tile_b, warp * 16, kt * 16);
    }
    float row_lse[2], row_dot[2];
    for (int r = 0; r < 2; ++r) {
        const int query = q0 + warp * 16 + g + 8 * r;
        row_lse[r] = query < tq ? lse[bh * tq + query] : POS_INF;
        row_dot[r] = query < tq ? dot[bh * tq + query] : 0.0f;
    }
    __syncthreads();
    int k_begin, k_end;
    key_range(q0, tk, causal, window, BWD_STEP, &k_begin, &k_end);
    float acc[DT][4];
    for (int d = 0; d < DT; ++d) for (int e = 0; e < 4; ++e) acc[d][e] = 0.0f;
    for (int k0 = k_begin; k0 < k_end; k0 += BWD_STEP) {
        load_tile<D, BWD_STEP>(tile_a, ks, k_t, k0, tk);
        load_tile<D, BWD_STEP>(tile_b, vs, v_t, k0, tk);
        copy_commit();
        copy_wait<0>();
        __syncthreads();
        float s[NT][4], dp[NT][4];
        for (int j = 0; j < NT; ++j) for (int e = 0; e < 4; ++e) { s[j][e] = 0.0f; dp[j][e] = 0.0f; }
        for (int kt = 0; kt < KT; ++kt) {
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bk[4], bv[4];
                load_b<D>(bk, tile_a, np * 16, kt * 16);
                mma(s[2 * np], qa[kt], bk[0], bk[1]);
                mma(s[2 * np + 1], qa[kt], bk[2], bk[3]);
                load_b<D>(bv, tile_b, np * 16, kt * 16);
                mma(dp[2 * np], ga[kt], bv[0], bv[1]);
                mma(dp[2 * np + 1], ga[kt], bv[2], bv[3]);
            }
        }
        for (int j = 0; j < NT; ++j) {
            for (int e = 0; e < 4; ++e) {
                const int query = q0 + warp * 16 + g + 8 * (e >> 1), key = k0 + 8 * j + 2 * t + (e & 1);
                const float p = visible(query, key, tk, causal, window) ? expf(s[j][e] * scale - row_lse[e >> 1])
                                                                        : 0.0f;
                float dpv = dp[j][e];
                if (dropout) dpv = keep(seed_mix, threshold, bh, tq, tk, query, key) ? dpv * rescale : 0.0f;
                s[j][e] = p * (dpv - row_dot[e >> 1]);
            }
        }
        unsigned da[BWD_STEP / 16][4];
        for (int kk = 0; kk < BWD_STEP / 16; ++kk) as_operand(da[kk], s[2 * kk], s[2 * kk + 1]);
        for (int kk = 0; kk < BWD_STEP / 16; ++kk) {
            for (int dn = 0; dn < DT / 2; ++dn) {
                unsigned bk[4];
                load_b_trans<D>(bk, tile_a, kk * 16, dn * 16);
                mma(acc[2 * dn], da[kk], bk[0], bk[1]);
                mma(acc[2 * dn + 1], da[kk], bk[2], bk[3]);
            }
        }
        __syncthreads();
    }
    for (int r = 0; r < 2; ++r) {
        const int query = q0 + warp * 16 + g + 8 * r;
        if (query >= tq) continue;
        X_t* out = dq + (bh * tq + query) * D;
        for (int d = 0; d < DT; ++d)
            *(unsigned*)(out + 8 * d + 2 * t) = pack(acc[d][2 * r] * scale, acc[d][2 * r + 1] * scale);
    }
}

template <int D>
__device__ __forceinline__ void attention_backward_dkdv(ATTENTION_ARGS, const X_t* dout, long long do_b,
                                                        long long do_h, long long do_t, const float* lse,
                                                        const float* dot, X_t* dk, X_t* dv) {
    constexpr int KT = D / 16, NT = BWD_STEP / 8, DT = D / 8;
    __shared__ __align__(16) unsigned short tile_a[ROWS * (D + 8)];  // the keys, then each step's queries
    __shared__ __align__(16) unsigned short tile_b[ROWS * (D + 8)];  // the values, then the output gradients
    __shared__ float step_lse[BWD_STEP], step_dot[BWD_STEP];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, hk = blockIdx.y, k0 = blockIdx.x * ROWS;
    const bool dropout = threshold != 0ull;

    load_tile<D, ROWS>(tile_a, k + b * k_b + hk * k_h, k_t, k0, tk);
    load_tile<D, ROWS>(tile_b, v + b * v_b + hk * v_h, v_t, k0, tk);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    unsigned ka[KT][4], va[KT][4];
    for (int kt = 0; kt < KT; ++kt) {
        load_a<D>(ka[kt], tile_a, warp * 16, kt * 16);
        load_a<D>(va[kt], tile_b, warp * 16, kt * 16);
    }
    __syncthreads();
    float acc_k[DT][4], acc_v[DT][4];
    for (int d = 0; d < DT; ++d) for (int e = 0; e < 4; ++e) { acc_k[d][e] = 0.0f; acc_v[d][e] = 0.0f; }
    int q_begin, q_end;
    query_range(k0, tq, causal, window, BWD_STEP, &q_begin, &q_end);
    for (int member = 0; member < group; ++member) {  // the query heads sharing this key/value head
        const int h = hk * group + member;
        const long long bh = (long long)b * heads + h;
        for (int s0 = q_begin; s0 < q_end; s0 += BWD_STEP) {
            load_tile<D, BWD_STEP>(tile_a, q + b * q_b + h * q_h, q_t, s0, tq);
            load_tile<D, BWD_STEP>(tile_b, dout + b * do_b + h * do_h, do_t, s0, tq);
            copy_commit();
            if (threadIdx.x < BWD_STEP) {
                const int query = s0 + threadIdx.x;
                step_lse[threadIdx.x] = query < tq ? lse[bh * tq + query] : POS_INF;
                step_dot[threadIdx.x] = query < tq ? dot[bh * tq + query] : 0.0f;
            }
            copy_wait<0>();
            __syncthreads();
            float st[NT][4], dpt[NT][4];  // S^T and dP^T: keys are rows, this step's queries columns
            for (int j = 0; j < NT; ++j) for (int e = 0; e < 4; ++e) { st[j][e] = 0.0f; dpt[j][e] = 0.0f; }
            for (int kt = 0; kt < KT; ++kt) {
                for (int np = 0; np < NT / 2; ++np) {
                    unsigned bq[4], bg[4];
                    load_b<D>(bq, tile_a, np * 16, kt * 16);
                    mma(st[2 * np], ka[kt], bq[0], bq[1]);
                    mma(st[2 * np + 1], ka[kt], bq[2], bq[3]);
                    load_b<D>(bg, tile_b, np * 16, kt * 16);
                    mma(dpt[2 * np], va[kt], bg[0], bg[1]);
                    mma(dpt[2 * np + 1], va[kt], bg[2], bg[3]);
                }
            }
            for (int j = 0; j < NT; ++j) {
                for (int e = 0; e < 4; ++e) {
                    const int key = k0 + warp * 16 + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
                    const int query = s0 + col;
                    const float p = visible(query, key, tk, causal, window) ? expf(st[j][e] * scale - step_lse[col])
                                                                            : 0.0f;
                    float dpv = dpt[j][e];
                    bool kept = true;
                    if (dropout) {
                        kept = keep(seed_mix, threshold, bh, tq, tk, query, key);
                        dpv = kept ? dpv * rescale : 0.0f;
                    }
                    st[j][e] = kept ? p : 0.0f;
                    dpt[j][e] = p * (dpv - step_dot[col]);
                }
            }
            unsigned pa[BWD_STEP / 16][4], da[BWD_STEP / 16][4];
            for (int kk = 0; kk < BWD_STEP / 16; ++kk) {
                as_operand(pa[kk], st[2 * kk], st[2 * kk + 1]);
                as_operand(da[kk], dpt[2 * kk], dpt[2 * kk + 1]);
            }
            for (int kk = 0; kk < BWD_STEP / 16; ++kk) {
                for (int dn = 0; dn < DT / 2; ++dn) {
                    unsigned bg[4], bq[4];
                    load_b_trans<D>(bg, tile_b, kk * 16, dn * 16);
                    mma(acc_v[2 * dn], pa[kk], bg[0], bg[1]);
                    mma(acc_v[2 * dn + 1], pa[kk], bg[2], bg[3]);
                    load_b_trans<D>(bq, tile_a, kk * 16, dn * 16);
                    mma(acc_k[2 * dn], da[kk], bq[0], bq[1]);
                    mma(acc_k[2 * dn + 1], da[kk], bq[2], bq[3]);
                }
            }
            __syncthreads();
        }
    }
    const float v_scale = dropout ? rescale : 1.0f;
    for (int r = 0; r < 2; ++r) {
        const int key = k0 + warp * 16 + g + 8 * r;
        if (key >= tk) continue;
        const long long row = ((long long)b * (heads / group) + hk) * tk + key;
        for (int d = 0; d < DT; ++d) {
            *(unsigned*)(dk + row * D + 8 * d + 2 * t) = pack(acc_k[d][2 * r] * scale, acc_k[d][2 * r + 1] * scale);
            *(unsigned*)(dv + row * D + 8 * d + 2 * t) = pack(acc_v[d][2 * r] * v_scale,
                                                              acc_v[d][2 * r + 1] * v_scale);
        }
    }
}

#define INSTANCES(D)                                                                                              \
extern "C" __global__ void __launch_bounds__(THREADS) attention_forward_d##D(ATTENTION_ARGS, X_t* out,            \
                                                                             float* lse) {                       \
    attention_forward<D>(ATTENTION_PASS, out, lse);                                                               \
}                                                                                                                 \
extern "C" __global__ void __launch_bounds__(THREADS) attention_backward_dq_d##D(                                 \
        ATTENTION_ARGS, const X_t* dout, long long do_b, long long do_h, long long do_t, const float* lse,        \
        const float* dot, X_t* dq) {                                                                              \
    attention_backward_dq<D>(ATTENTION_PASS, dout, do_b, do_h, do_t, lse, dot, dq);                               \
}                                                                                                                 \
extern "C" __global__ void __launch_bounds__(THREADS) attention_backward_dkdv_d##D(                               \
        ATTENTION_ARGS, const X_t* dout, long long do_b, long long do_h, long long do_t, const float* lse,        \
        const float* dot, X_t* dk, X_t* dv) {                                                                     \
    attention_backward_dkdv<D>(ATTENTION_PASS, dout, do_b, do_h, do_t, lse, dot, dk, dv);                         \
}
INSTANCES(64)
INSTANCES(128)
""")

HEAD_DIMS = (64, 128)
ROWS, FWD_KEYS, BWD_STEP, THREADS, WARPS = 64, 64, 32, 128, 4
