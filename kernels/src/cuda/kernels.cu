// The CUDA kernels of opentinker-kernels, compiled at run time by NVRTC for the device's own
// architecture (so `cargo build --features cuda` needs no CUDA toolkit).
//
// The contract is the CPU kernels': a row's result depends only on that row's inputs. Every
// reduction runs in an order fixed by its length alone: lane `l` of a warp sums elements
// l, l + 32, ... (or, vectorised, the float4 chunks l, l + 32, ...) with fused multiply-adds, and
// the lanes' partial sums meet in one xor butterfly, which leaves the same bits in every lane
// (floating-point addition is commutative). No kernel splits a reduction by the number of rows,
// uses atomics, or lets the grid shape choose a reduction order.

#define ROW_TILE 8
#define FULL_MASK 0xffffffffu
#define NEG_INFINITY __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Weights as f32, or as bf16 bits widened to f32 (the upper half of the f32's bits): four
// consecutive ones (chunk c), or one.
__device__ __forceinline__ float bf16_to_float(unsigned short v) {
    return __uint_as_float(((unsigned int)v) << 16);
}
__device__ __forceinline__ float4 load4(const float *w, int c) {
    return reinterpret_cast<const float4 *>(w)[c];
}
__device__ __forceinline__ float4 load4(const unsigned short *w, int c) {
    const uint2 packed = reinterpret_cast<const uint2 *>(w)[c];
    return make_float4(__uint_as_float(packed.x << 16), __uint_as_float(packed.x & 0xffff0000u),
                       __uint_as_float(packed.y << 16), __uint_as_float(packed.y & 0xffff0000u));
}
__device__ __forceinline__ float load1(const float *w, int k) { return w[k]; }
__device__ __forceinline__ float load1(const unsigned short *w, int k) { return bf16_to_float(w[k]); }

// acc[r][c] += dot(x row r, W row c) over `len` elements, lane-strided: lane l sums the float4
// chunks l, l + 32, ... (or, when `len` or `stride` is not a multiple of 4, the elements l,
// l + 32, ...) in order, then the lanes meet in the butterfly. `rows` <= R rows of x and
// `cols` <= C rows of W, each `stride` apart. Every output's sum runs in this one order whatever
// R, C and the other rows and columns of the tile are, so tiles of any shape give a row the
// same bits. (x and W come from cudaMalloc, 256-byte aligned, so the vectorised loads are
// aligned when the stride and the start are multiples of 4.)
template <typename W, int R, int C, int U>
__device__ __forceinline__ void tile_dot(const float *__restrict__ x, const W *__restrict__ w, int len,
                                         int stride, int rows, int cols, float acc[R][C]) {
    const int lane = threadIdx.x & 31;
    if ((len & 3) == 0 && (stride & 3) == 0) {
        const int chunks = len >> 2;
        // U of the lane's chunks at a time: their weight loads are issued together before any
        // of their sums wait on them (a decode projection is otherwise one memory latency per
        // chunk); the sums still take the chunks in order.
        for (int ch = lane; ch < chunks; ch += 32 * U) {
            float4 wv[U][C];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int c = 0; c < C; ++c)
                    wv[u][c] = ch + 32 * u < chunks && c < cols ? load4(w + (size_t)c * stride, ch + 32 * u)
                                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (ch + 32 * u >= chunks) break;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r < rows) {
                        const float4 xv = reinterpret_cast<const float4 *>(x + (size_t)r * stride)[ch + 32 * u];
#pragma unroll
                        for (int c = 0; c < C; ++c) {
                            acc[r][c] = fmaf(xv.x, wv[u][c].x, acc[r][c]);
                            acc[r][c] = fmaf(xv.y, wv[u][c].y, acc[r][c]);
                            acc[r][c] = fmaf(xv.z, wv[u][c].z, acc[r][c]);
                            acc[r][c] = fmaf(xv.w, wv[u][c].w, acc[r][c]);
                        }
                    }
                }
            }
        }
    } else {
        for (int k = lane; k < len; k += 32) {
            float wv[C];
#pragma unroll
            for (int c = 0; c < C; ++c) wv[c] = c < cols ? load1(w + (size_t)c * stride, k) : 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < rows) {
                    const float xv = x[(size_t)r * stride + k];
#pragma unroll
                    for (int c = 0; c < C; ++c) acc[r][c] = fmaf(xv, wv[c], acc[r][c]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = warp_sum(acc[r][c]);
    }
}

// A projection's fused LoRA expand: the shrink's output (rows × stride, scaled), the site's B
// pool (slots × out × max_rank) and {slot, rank} per row (rank 0: no adapter); null `b_pool`
// for none.
struct FusedLora {
    const float *shrunk;
    const float *b_pool;
    const int *row_adapters;
    int max_rank;
    int stride;
};

// Stores one warp's tile of a projection, rows r0.. (`rows` of them) × columns j0.. (`cols`):
// y = acc (+ bias) (+ the row's adapter delta), or y += ... when `accumulate`. The bias is added
// after the sum, as a separate add would add it. After the butterfly every lane holds every
// sum; lane i stores output i. The adapter delta is then added to what the lane stored, summed
// over k in order as `lora_expand` sums it, so the bits are those of the projection followed
// by `lora_apply`; it runs as one loop over the lane's outputs (unrolled per output, as the
// plain store is, it made the kernels slow to compile and slower to run).
template <int R, int C>
__device__ __forceinline__ void store_tile(float acc[R][C], const float *__restrict__ bias,
                                           const FusedLora &lora, float *__restrict__ y, int out, int r0,
                                           int rows, int j0, int cols, int accumulate) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (((r * C + c) & 31) == lane && r < rows && c < cols) {
                const size_t o = (size_t)(r0 + r) * out + j0 + c;
                float v = accumulate ? y[o] + acc[r][c] : acc[r][c];
                if (bias) v += bias[j0 + c];
                y[o] = v;
            }
        }
    }
    if (!lora.b_pool) return;
    for (int i = lane; i < R * C; i += 32) {
        const int r = i / C, c = i % C;
        if (r >= rows || c >= cols) continue;
        const int slot = lora.row_adapters[2 * (r0 + r)], rank = lora.row_adapters[2 * (r0 + r) + 1];
        if (rank == 0) continue;
        const float *b = lora.b_pool + ((size_t)slot * out + j0 + c) * lora.max_rank;
        const float *s = lora.shrunk + (size_t)(r0 + r) * lora.stride;
        float sum = 0.0f;
        for (int k = 0; k < rank; ++k) sum = fmaf(s[k], b[k], sum);
        y[(size_t)(r0 + r) * out + j0 + c] += sum;
    }
}

// y (rows × out) = x (rows × inp) · Wᵀ (+ bias), or y += ... when `accumulate`. W is out × inp,
// of f32 or of bf16 (computed in f32: half the bytes a decode step streams); `bias` (out wide)
// may be null. Two tilings of the same sums (`tile_dot`'s order), so a row's bits do not depend
// on which one ran it:
// - narrow, for up to ROW_TILE rows a tile (decode): a warp per output column, blockIdx.y a tile
//   of ROW_TILE rows; as many warps as columns keep the weights streaming at full bandwidth. A
//   single row (batch-1 decode) has its own variant with four chunks' loads in flight.
// - wide, for more rows: a warp per WIDE_ROWS × WIDE_COLS outputs, so each weight read serves
//   WIDE_ROWS rows and each x read WIDE_COLS columns, and the block's warps share each x tile
//   through shared memory (the narrow tiling re-read the x tile from L2 once per column, which
//   bound it from 16 rows on); blockIdx.x is the row tile, so the blocks that share a column
//   group run together and read its weights from HBM once.
#define WIDE_ROWS 16
#define WIDE_COLS 4
// float4 chunks of each x row a wide block stages at a time (a multiple of 32, so each lane
// still takes chunks lane, lane + 32, ... in order across stages).
#define WIDE_STAGE 64
// The narrow tiling with R rows a tile; U chunks' weight loads issued together (see
// `tile_dot`). Measured on an H200: U = 4 with 8-row tiles ran the 18944 -> 3584 projection
// 1.6x (1 row) to 3.3x (16 rows) slower than U = 1, while with 1-row tiles it is what lets a
// batch-1 decode step keep enough loads in flight.
template <typename W, int R, int U>
__device__ __forceinline__ void linear_narrow(const float *__restrict__ x, const W *__restrict__ w,
                                              const float *__restrict__ bias, float *__restrict__ y,
                                              int rows, int inp, int out, int accumulate,
                                              const FusedLora &lora) {
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * warps + warp;
    if (j >= out) return;
    const int r0 = blockIdx.y * R, n = min(R, rows - r0);
    float acc[R][1];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    tile_dot<W, R, 1, U>(x + (size_t)r0 * inp, w + (size_t)j * inp, inp, inp, n, 1, acc);
    store_tile<R, 1>(acc, bias, lora, y, out, r0, n, j, 1, accumulate);
}

template <typename W>
__device__ __forceinline__ void linear_tile(const float *__restrict__ x, const W *__restrict__ w,
                                            const float *__restrict__ bias, float *__restrict__ y,
                                            int rows, int inp, int out, int accumulate,
                                            const FusedLora &lora) {
    linear_narrow<W, ROW_TILE, 1>(x, w, bias, y, rows, inp, out, accumulate, lora);
}

template <typename W>
__device__ __forceinline__ void linear_row(const float *__restrict__ x, const W *__restrict__ w,
                                           const float *__restrict__ bias, float *__restrict__ y,
                                           int rows, int inp, int out, int accumulate,
                                           const FusedLora &lora) {
    linear_narrow<W, 1, 4>(x, w, bias, y, rows, inp, out, accumulate, lora);
}

template <typename W>
__device__ __forceinline__ void linear_wide(const float *__restrict__ x, const W *__restrict__ w,
                                            const float *__restrict__ bias, float *__restrict__ y,
                                            int rows, int inp, int out, int accumulate,
                                            const FusedLora &lora) {
    __shared__ float4 staged[WIDE_ROWS][WIDE_STAGE];
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * WIDE_ROWS, n = min(WIDE_ROWS, rows - r0);
    const int j0 = (blockIdx.y * warps + warp) * WIDE_COLS;
    // Warps past the last column still stage their share of x.
    const int cols = max(0, min(WIDE_COLS, out - j0));
    float acc[WIDE_ROWS][WIDE_COLS];
#pragma unroll
    for (int r = 0; r < WIDE_ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < WIDE_COLS; ++c) acc[r][c] = 0.0f;
    }
    if ((inp & 3) != 0) {
        // Odd widths (tests, tiny models): the same order, unstaged.
        if (cols == 0) return;
        tile_dot<W, WIDE_ROWS, WIDE_COLS, 1>(x + (size_t)r0 * inp, w + (size_t)j0 * inp, inp, inp, n, cols,
                                          acc);
        store_tile<WIDE_ROWS, WIDE_COLS>(acc, bias, lora, y, out, r0, n, j0, cols, accumulate);
        return;
    }
    const int chunks = inp >> 2;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)r0 * inp);
    for (int base = 0; base < chunks; base += WIDE_STAGE) {
        const int stage = min(WIDE_STAGE, chunks - base);
        __syncthreads();
#pragma unroll 4
        for (int i = threadIdx.x; i < WIDE_ROWS * WIDE_STAGE; i += blockDim.x) {
            const int r = i / WIDE_STAGE, c = i % WIDE_STAGE;
            if (r < n && c < stage) staged[r][c] = x4[(size_t)r * chunks + base + c];
        }
        __syncthreads();
        if (cols == 0) continue;
        for (int c = lane; c < stage; c += 32) {
            float4 wv[WIDE_COLS];
#pragma unroll
            for (int cc = 0; cc < WIDE_COLS; ++cc)
                wv[cc] = cc < cols ? load4(w + (size_t)(j0 + cc) * inp, base + c)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < WIDE_ROWS; ++r) {
                if (r < n) {
                    const float4 xv = staged[r][c];
#pragma unroll
                    for (int cc = 0; cc < WIDE_COLS; ++cc) {
                        acc[r][cc] = fmaf(xv.x, wv[cc].x, acc[r][cc]);
                        acc[r][cc] = fmaf(xv.y, wv[cc].y, acc[r][cc]);
                        acc[r][cc] = fmaf(xv.z, wv[cc].z, acc[r][cc]);
                        acc[r][cc] = fmaf(xv.w, wv[cc].w, acc[r][cc]);
                    }
                }
            }
        }
    }
    if (cols == 0) return;
#pragma unroll
    for (int r = 0; r < WIDE_ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < WIDE_COLS; ++c) acc[r][c] = warp_sum(acc[r][c]);
    }
    store_tile<WIDE_ROWS, WIDE_COLS>(acc, bias, lora, y, out, r0, n, j0, cols, accumulate);
}

// The projection's entry points: x, W, bias (or null), y, the shape, then the fused LoRA
// expand (null `b_pool` for none; see `FusedLora`).
#define LINEAR_ENTRY(name, W, body)                                                                   \
    extern "C" __global__ void name(const float *__restrict__ x, const W *__restrict__ w,            \
                                    const float *__restrict__ bias, float *__restrict__ y, int rows, \
                                    int inp, int out, int accumulate, const float *shrunk,           \
                                    const float *b_pool, const int *row_adapters, int max_rank,      \
                                    int stride) {                                                    \
        const FusedLora lora = {shrunk, b_pool, row_adapters, max_rank, stride};                     \
        body(x, w, bias, y, rows, inp, out, accumulate, lora);                                       \
    }
LINEAR_ENTRY(linear_f32, float, linear_tile)
LINEAR_ENTRY(linear_bf16, unsigned short, linear_tile)
LINEAR_ENTRY(linear_wide_f32, float, linear_wide)
LINEAR_ENTRY(linear_wide_bf16, unsigned short, linear_wide)
LINEAR_ENTRY(linear_row_f32, float, linear_row)
LINEAR_ENTRY(linear_row_bf16, unsigned short, linear_row)

// A tile of the mixed-adapter LoRA apply: up to ROW_TILE consecutive rows that share one
// adapter, as {first row, rows, slot in the pools, rank}.
struct LoraTile {
    int row;
    int rows;
    int slot;
    int rank;
};

// The largest rank a LoRA pool may have: a tile's rank-space rows live in shared memory.
#define MAX_LORA_RANK 128
// Output columns one block of lora_expand expands, and the floats of B it stages at a time
// (each staged column padded to rank + 1 floats: rank 32 stages all 256 columns at once).
#define LORA_COLUMNS 256
#define LORA_STAGE_FLOATS (LORA_COLUMNS * 33)
// Elements of x in one segment of the shrink's sum, and the most segments (inp <= 32768).
#define SHRINK_SEGMENT 512
#define SHRINK_MAX_SEGMENTS 64

// The shrink of the mixed-adapter LoRA apply: s[r, k] = scale · Σ_i x[r, i] A[k, i] for each
// tile's rows and each k below the tile's rank, A from the tile's slot of the pool (slots ×
// max_rank × inp), into `shrunk` (rows × stride). A block per (tile, k): its warps take the
// SHRINK_SEGMENT-long segments of the sum (lane-strided within, as `tile_dot`), and thread r
// adds row r's segments in order, so the order depends only on inp. (A warp per (tile, k) over
// the whole width waited on one load after another with too few warps to hide it: tens of
// microseconds a site at 16 adapters.) Done once per tile, so `lora_expand`'s column blocks do
// not each read the tile's A again.
extern "C" __global__ void lora_shrink(const float *__restrict__ x, const float *__restrict__ a_pool,
                                       const LoraTile *__restrict__ tiles,
                                       const float *__restrict__ scales, float *__restrict__ shrunk,
                                       int inp, int max_rank, int stride) {
    __shared__ float partial[SHRINK_MAX_SEGMENTS][ROW_TILE];
    const LoraTile t = tiles[blockIdx.x];
    const int k = blockIdx.y;
    if (k >= t.rank) return;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int segments = (inp + SHRINK_SEGMENT - 1) / SHRINK_SEGMENT;
    const float *a = a_pool + ((size_t)t.slot * max_rank + k) * inp;
    const float *xt = x + (size_t)t.row * inp;
    for (int sg = warp; sg < segments; sg += warps) {
        const int begin = sg * SHRINK_SEGMENT;
        float acc[ROW_TILE][1];
#pragma unroll
        for (int r = 0; r < ROW_TILE; ++r) acc[r][0] = 0.0f;
        tile_dot<float, ROW_TILE, 1, 4>(xt + begin, a + begin, min(SHRINK_SEGMENT, inp - begin), inp, t.rows, 1,
                                     acc);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < ROW_TILE; ++r) partial[sg][r] = acc[r][0];
        }
    }
    __syncthreads();
    if (threadIdx.x < t.rows) {
        float total = 0.0f;
        for (int sg = 0; sg < segments; ++sg) total += partial[sg][threadIdx.x];
        shrunk[(size_t)(t.row + threadIdx.x) * stride + k] = scales[blockIdx.x] * total;
    }
}

// The expand: y[r, j] += Σ_k s[r, k] · B[j, k] for each tile's rows, B from the tile's slot of
// the pool (slots × out × max_rank). blockIdx.x: a tile; blockIdx.y: LORA_COLUMNS columns. The
// tile's rank-space rows are read into shared memory once, then as many of the block's columns
// of B as fit LORA_STAGE_FLOATS are copied to shared memory at a time (coalesced loads), and
// warp r adds row r's delta to every staged column, a lane per column, summing over k in order.
extern "C" __global__ void lora_expand(const float *__restrict__ shrunk, const float *__restrict__ b_pool,
                                       const LoraTile *__restrict__ tiles, float *__restrict__ y,
                                       int out, int max_rank, int stride) {
    __shared__ float rank_rows[ROW_TILE][MAX_LORA_RANK];
    __shared__ float staged[LORA_STAGE_FLOATS];
    const LoraTile t = tiles[blockIdx.x];
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int padded = t.rank + 1;
    for (int i = threadIdx.x; i < t.rows * t.rank; i += blockDim.x)
        rank_rows[i / t.rank][i % t.rank] = shrunk[(size_t)(t.row + i / t.rank) * stride + i % t.rank];
    const int first = blockIdx.y * LORA_COLUMNS;
    const int end = min(out, first + LORA_COLUMNS);
    const int per_stage = min(LORA_COLUMNS, LORA_STAGE_FLOATS / padded);
    for (int j0 = first; j0 < end; j0 += per_stage) {
        const int columns = min(per_stage, end - j0);
        __syncthreads();
        const float *b = b_pool + ((size_t)t.slot * out + j0) * max_rank;
#pragma unroll 8
        for (int i = threadIdx.x; i < columns * t.rank; i += blockDim.x)
            staged[(i / t.rank) * padded + i % t.rank] = b[(size_t)(i / t.rank) * max_rank + i % t.rank];
        __syncthreads();
        for (int r = warp; r < t.rows; r += warps) {
            for (int c = lane; c < columns; c += 32) {
                float sum = 0.0f;
                for (int k = 0; k < t.rank; ++k) sum = fmaf(rank_rows[r][k], staged[c * padded + k], sum);
                y[(size_t)(t.row + r) * out + j0 + c] += sum;
            }
        }
    }
}

// Sum of a block's values in one fixed tree (blockDim.x a power of two, at most 1024).
template <typename T> __device__ T block_sum(T v, T *scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int offset = blockDim.x >> 1; offset > 0; offset >>= 1) {
        if (threadIdx.x < offset) scratch[threadIdx.x] += scratch[threadIdx.x + offset];
        __syncthreads();
    }
    const T total = scratch[0];
    __syncthreads();
    return total;
}

// RMSNorm of each row (n wide) of x into out (which may be x). Block per row.
__device__ __forceinline__ void rms_norm_row(const float *x, float *out, const float *__restrict__ weight,
                                             int n, float eps) {
    __shared__ float scratch[1024];
    const float *row = x + (size_t)blockIdx.x * n;
    float *normed = out + (size_t)blockIdx.x * n;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(row[i], row[i], sum);
    const float mean_square = block_sum(sum, scratch) / (float)n;
    const float inv = 1.0f / sqrtf(mean_square + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) normed[i] = row[i] * inv * weight[i];
}

extern "C" __global__ void rms_norm(float *x, const float *__restrict__ weight, int n, float eps) {
    rms_norm_row(x, x, weight, n, eps);
}

extern "C" __global__ void rms_norm_into(const float *__restrict__ x, float *__restrict__ out,
                                        const float *__restrict__ weight, int n, float eps) {
    rms_norm_row(x, out, weight, n, eps);
}

// Rotary embedding (rotate halves) of x (rows × heads × head_dim) in place, row r at
// positions[r]; cos and sin are (max_positions × head_dim). Thread per (row, head, i < half).
extern "C" __global__ void rope(float *__restrict__ x, const int *__restrict__ positions,
                               const float *__restrict__ cos_table, const float *__restrict__ sin_table,
                               int rows, int heads, int head_dim) {
    const int half = head_dim >> 1;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * heads * half) return;
    const int i = index % half;
    const size_t head = index / half;
    const int r = head / heads;
    float *v = x + head * head_dim;
    const float *c = cos_table + (size_t)positions[r] * head_dim;
    const float *s = sin_table + (size_t)positions[r] * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * s[i];
    v[i + half] = b * c[i + half] + a * s[i + half];
}

// The gate's activation is g · sigmoid(z(g)): z = g for SiLU (activation 0), and for GELU's
// tanh form (activation 1) z = 2·sqrt(2/π)·(g + 0.044715 g³), since (1 + tanh(u)) / 2 is
// sigmoid(2u). Returns z and writes dz/dg. As the kernels' Activation.
__device__ float gate_argument(int activation, float g, float *slope) {
    if (activation == 0) {
        *slope = 1.0f;
        return g;
    }
    const float c = 1.5957691216057308f, cubic = 0.044715f;  // 2·sqrt(2/π)
    *slope = c * (1.0f + 3.0f * cubic * g * g);
    return c * (g + cubic * g * g * g);
}

// gate = act(gate) · up, elementwise.
extern "C" __global__ void gate_mul(float *__restrict__ gate, const float *__restrict__ up, size_t n,
                                   int activation) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        float slope;
        const float z = gate_argument(activation, g, &slope);
        gate[i] = g / (1.0f + expf(-z)) * up[i];
    }
}

// x *= factor, elementwise.
extern "C" __global__ void scale_in_place(float *__restrict__ x, size_t n, float factor) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}

// x[r, :] *= factors[r] for each row (width wide): a training pass's per-sequence inverse temperature.
extern "C" __global__ void scale_rows(float *__restrict__ x, const float *__restrict__ factors,
                                      size_t width, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factors[i / width];
}

// log Σ exp of one row (n wide) times `scale` (1, or a sampling temperature's inverse), the sum in
// f64 as on the CPU; every thread of the block gets it.
__device__ float row_log_sum_exp(const float *row, int n, float scale = 1.0f) {
    __shared__ double scratch[1024];
    __shared__ float max_scratch[32];
    float m = NEG_INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i] * scale);
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) max_scratch[threadIdx.x >> 5] = m;
    __syncthreads();
    m = NEG_INFINITY;
    for (int w = 0; w < (blockDim.x >> 5); ++w) m = fmaxf(m, max_scratch[w]);
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += (double)expf(row[i] * scale - m);
    return (float)log(block_sum(sum, scratch)) + m;
}

// log_softmax of each row (n wide), the normaliser summed in f64 as on the CPU. Block per row.
extern "C" __global__ void log_softmax(const float *__restrict__ x, float *__restrict__ out, int n) {
    const float *row = x + (size_t)blockIdx.x * n;
    const float log_sum = row_log_sum_exp(row, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[(size_t)blockIdx.x * n + i] = row[i] - log_sum;
}

// Where position p of a sequence lives in a paged cache (blocks × kv_heads × block_size × head_dim).
__device__ __forceinline__ size_t cache_offset(const int *table, int p, int kv_head, int kv_heads,
                                               int block_size, int head_dim) {
    const int block = table[p / block_size];
    return (((size_t)block * kv_heads + kv_head) * block_size + p % block_size) * head_dim;
}

// Writes each row's keys and values (rows × kv_heads × head_dim) at its sequence's position.
// Thread per (row, kv head, dim).
extern "C" __global__ void kv_write(const float *__restrict__ k, const float *__restrict__ v,
                                   float *__restrict__ k_cache, float *__restrict__ v_cache,
                                   const int *__restrict__ block_tables, int max_blocks,
                                   const int *__restrict__ row_sequence, const int *__restrict__ row_position,
                                   int rows, int kv_heads, int head_dim, int block_size) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * kv_heads * head_dim) return;
    const int d = index % head_dim;
    const int h = (index / head_dim) % kv_heads;
    const int r = index / ((size_t)head_dim * kv_heads);
    const int *table = block_tables + (size_t)row_sequence[r] * max_blocks;
    const size_t at = cache_offset(table, row_position[r], h, kv_heads, block_size, head_dim) + d;
    k_cache[at] = k[index];
    v_cache[at] = v[index];
}

// Causal attention of q (rows × heads × head_dim) over a paged KV cache: row r of sequence
// row_sequence[r] at position row_position[r] attends to that sequence's positions 0..=p, keys
// and values found through its block table. A block of ATTENTION_THREADS per (row, head); the
// scores live in dynamic shared memory (p + 1 floats). Warp w scores positions w, w + warps, ...,
// each a dot whose lanes take dimensions lane, lane + 32, ... (coalesced reads of the key) and
// meet in the butterfly; the softmax's max and sum run over a fixed thread-strided split and the
// block's fixed tree; thread d sums dimension d's weighted values over the positions in order.
// Every order depends only on p and the head size, so a row's output is the same in a prefill,
// a decode step or any batch. (One warp per (row, head) with a lane per position read each key
// and value one dependent load at a time: latency-bound, milliseconds of a 7B decode step.)
#define ATTENTION_THREADS 128
// scores[0..n) replaced by exp(score - max), max's tree and the sum's fixed by the block: returns
// the sum, and the max in *max_out when given. Every thread of the block (ATTENTION_THREADS, a power of
// two) calls it; `reduce` holds one float per thread.
__device__ float exponentiate_scores(float *scores, int n, float *reduce, float *max_out) {
    float m = NEG_INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) m = fmaxf(m, scores[p]);
    reduce[threadIdx.x] = m;
    __syncthreads();
    for (int offset = blockDim.x >> 1; offset > 0; offset >>= 1) {
        if (threadIdx.x < offset) reduce[threadIdx.x] = fmaxf(reduce[threadIdx.x], reduce[threadIdx.x + offset]);
        __syncthreads();
    }
    m = reduce[0];
    __syncthreads();
    float partial = 0.0f;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const float e = expf(scores[p] - m);
        scores[p] = e;
        partial += e;
    }
    if (max_out) *max_out = m;
    return block_sum(partial, reduce);
}

extern "C" __global__ void paged_attention(const float *__restrict__ q, const float *__restrict__ k_cache,
                                          const float *__restrict__ v_cache,
                                          const int *__restrict__ block_tables, int max_blocks,
                                          const int *__restrict__ row_sequence,
                                          const int *__restrict__ row_position, float *__restrict__ out,
                                          int heads, int kv_heads, int head_dim, int block_size,
                                          int window, float scale) {
    extern __shared__ float scores[];
    __shared__ float reduce[ATTENTION_THREADS];
    const int r = blockIdx.x, h = blockIdx.y;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv_head = h / (heads / kv_heads);
    // Positions first..=position: all before it, or the last `window` (window > 0).
    const int first = window > 0 ? max(0, row_position[r] + 1 - window) : 0;
    const int n = row_position[r] + 1 - first;
    const int *table = block_tables + (size_t)row_sequence[r] * max_blocks;
    const float *query = q + ((size_t)r * heads + h) * head_dim;
    for (int i = warp; i < n; i += warps) {
        const float *key = k_cache + cache_offset(table, first + i, kv_head, kv_heads, block_size, head_dim);
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s = fmaf(query[d], key[d], s);
        s = warp_sum(s);
        if (lane == 0) scores[i] = s * scale;
    }
    __syncthreads();
    const float total = exponentiate_scores(scores, n, reduce, nullptr);
    float *o = out + ((size_t)r * heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        const float *values = v_cache + (size_t)kv_head * block_size * head_dim + d;
#pragma unroll 8
        for (int i = 0; i < n; ++i) {
            const int p = first + i;
            const size_t block = table[p / block_size];
            const float value = values[(block * kv_heads * block_size + p % block_size) * head_dim];
            acc = fmaf(scores[i] / total, value, acc);
        }
        o[d] = acc;
    }
}

// out[r] = table[indices[r]] (rows of `width`). Thread per value.
extern "C" __global__ void gather_rows(const float *__restrict__ table, const int *__restrict__ indices,
                                      float *__restrict__ out, int rows, int width) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * width) return;
    const int r = index / width, i = index % width;
    out[index] = table[(size_t)indices[r] * width + i];
}

// y[r, j] += bias[j]. Thread per value.
extern "C" __global__ void add_bias(float *__restrict__ y, const float *__restrict__ bias, size_t n, int width) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += bias[i % width];
}

// x += y, elementwise.
extern "C" __global__ void add_in_place(float *__restrict__ x, const float *__restrict__ y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// The index of a row's largest value (the first of equals; NaN never wins; 0 when all are NaN);
// every thread of the block gets it.
__device__ int row_argmax(const float *row, int width) {
    __shared__ float best_value[1024];
    __shared__ int best_index[1024];
    float value = NEG_INFINITY;
    int index = width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        if (row[i] > value) {
            value = row[i];
            index = i;
        }
    }
    best_value[threadIdx.x] = value;
    best_index[threadIdx.x] = index;
    __syncthreads();
    for (int offset = blockDim.x >> 1; offset > 0; offset >>= 1) {
        if (threadIdx.x < offset) {
            const float v = best_value[threadIdx.x + offset];
            const int i = best_index[threadIdx.x + offset];
            if (v > best_value[threadIdx.x] || (v == best_value[threadIdx.x] && i < best_index[threadIdx.x])) {
                best_value[threadIdx.x] = v;
                best_index[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    const int best = best_index[0] < width ? best_index[0] : 0;
    __syncthreads();
    return best;
}

// The index of each row's largest value (row_argmax). Block per row.
extern "C" __global__ void argmax_rows(const float *__restrict__ x, int *__restrict__ out, int width) {
    const int best = row_argmax(x + (size_t)blockIdx.x * width, width);
    if (threadIdx.x == 0) out[blockIdx.x] = best;
}

// x[i] = low + (high - low) · u(seed, i), u uniform in [0, 1) from a hash of (seed, i): random
// weights made on the device, for benchmarks of shapes too big to generate on the host.
extern "C" __global__ void fill_uniform(float *__restrict__ x, size_t n, unsigned long long seed,
                                       float low, float high) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = low + (high - low) * (float)(z >> 40) * (1.0f / 16777216.0f);
}

// out[r] = table[indices[r]] widened from bf16 (rows of `width`). Thread per value.
extern "C" __global__ void gather_rows_bf16(const unsigned short *__restrict__ table,
                                           const int *__restrict__ indices, float *__restrict__ out,
                                           int rows, int width) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * width) return;
    const int r = index / width, i = index % width;
    out[index] = bf16_to_float(table[(size_t)indices[r] * width + i]);
}

// out = x rounded to bf16 (to nearest, ties to even; NaN stays NaN), as `bf16_bits` on the host.
extern "C" __global__ void to_bf16(const float *__restrict__ x, unsigned short *__restrict__ out, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned int bits = __float_as_uint(x[i]);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        out[i] = (unsigned short)((bits >> 16) | 0x40u);
    } else {
        out[i] = (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
}

// ---- Training: the backward of the row-wise ops, and the optimizer ----

// The backward of rms_norm_into for each row (n wide): dx += ∂x from dy, the inverse rms
// recomputed from x, and written to inverse[row] for rms_norm_weight_grad. Block per row; as
// ops::rms_norm_backward.
extern "C" __global__ void rms_norm_backward(const float *__restrict__ x, const float *__restrict__ weight,
                                            const float *__restrict__ dy, float *__restrict__ dx,
                                            float *__restrict__ inverse, int n, float eps) {
    __shared__ float scratch[1024];
    const size_t base = (size_t)blockIdx.x * n;
    float square_sum = 0.0f, dot = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[base + i];
        square_sum = fmaf(v, v, square_sum);
        dot = fmaf(dy[base + i] * weight[i], v, dot);
    }
    const float inv = 1.0f / sqrtf(block_sum(square_sum, scratch) / (float)n + eps);
    const float coefficient = inv * inv * inv * block_sum(dot, scratch) / (float)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        dx[base + i] += inv * dy[base + i] * weight[i] - coefficient * x[base + i];
    }
    if (threadIdx.x == 0) inverse[blockIdx.x] = inv;
}

// dweight[j] += Σ_r dy[r, j] · x[r, j] · inverse[r], the rows in order (so the sum never
// depends on how the rows were batched). Thread per column.
extern "C" __global__ void rms_norm_weight_grad(const float *__restrict__ x, const float *__restrict__ dy,
                                               const float *__restrict__ inverse,
                                               float *__restrict__ dweight, int rows, int n) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float sum = dweight[j];
    for (int r = 0; r < rows; r++) {
        const size_t at = (size_t)r * n + j;
        sum += dy[at] * x[at] * inverse[r];
    }
    dweight[j] = sum;
}

// The backward of rope in place on the gradient: the rotation by the opposite angle (its
// transpose). Thread per (row, head, i < half); as ops::rope_backward.
extern "C" __global__ void rope_backward(float *__restrict__ dx, const int *__restrict__ positions,
                                        const float *__restrict__ cos_table,
                                        const float *__restrict__ sin_table, int rows, int heads,
                                        int head_dim) {
    const int half = head_dim >> 1;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * heads * half) return;
    const int i = index % half;
    const size_t head = index / half;
    const int r = head / heads;
    float *v = dx + head * head_dim;
    const float *c = cos_table + (size_t)positions[r] * head_dim;
    const float *s = sin_table + (size_t)positions[r] * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] + b * s[i + half];
    v[i + half] = b * c[i + half] - a * s[i];
}

// The backward of gate_mul from its inputs: writes d_gate and d_up. Elementwise; as
// ops::gate_mul_backward.
extern "C" __global__ void gate_mul_backward(const float *__restrict__ gate, const float *__restrict__ up,
                                            const float *__restrict__ d_out, float *__restrict__ d_gate,
                                            float *__restrict__ d_up, size_t n, int activation) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i], d = d_out[i];
    float slope;
    const float z = gate_argument(activation, g, &slope);
    const float sigmoid = 1.0f / (1.0f + expf(-z));
    d_up[i] = d * g * sigmoid;
    d_gate[i] = d * up[i] * sigmoid * (1.0f + g * (1.0f - sigmoid) * slope);
}

// Values of x summed per chunk of SQUARE_CHUNK: chunk b's sum of squares (in f64) into
// partials[b], in one fixed tree, so that the total (summed in chunk order on the host) depends
// on the length alone. Block per chunk.
#define SQUARE_CHUNK 4096
extern "C" __global__ void square_sum_partials(const float *__restrict__ x, size_t n,
                                              double *__restrict__ partials) {
    __shared__ double scratch[1024];
    const size_t start = (size_t)blockIdx.x * SQUARE_CHUNK;
    double sum = 0.0;
    for (size_t i = start + threadIdx.x; i < n && i < start + SQUARE_CHUNK; i += blockDim.x) {
        sum += (double)x[i] * (double)x[i];
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One AdamW step of each weight: the gradient scaled by `clip` (the global norm's clip
// factor), the moments updated, then the decoupled decay and the bias-corrected update, in the
// order the CPU trainer takes them. Elementwise.
extern "C" __global__ void adamw(float *__restrict__ w, const float *__restrict__ grad, float *__restrict__ m,
                                float *__restrict__ v, size_t n, float clip, float learning_rate,
                                float beta1, float beta2, float eps, float weight_decay, float bias1,
                                float bias2) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = grad[i] * clip;
    const float first = m[i] * beta1 + g * (1.0f - beta1);
    const float second = v[i] * beta2 + g * g * (1.0f - beta2);
    const float update = (first / bias1) / (sqrtf(second / bias2) + eps);
    w[i] = w[i] * (1.0f - learning_rate * weight_decay) - update * learning_rate;
    m[i] = first;
    v[i] = second;
}

// dx (rows × inp) += dy (rows × out) · W (out × inp): the input's gradient through a frozen
// projection, W in f32 or bf16. A block computes a 64 × 64 tile of dx, each of its 256 threads
// 4 × 4 values, over `out` in chunks of 16 staged in shared memory (so W is read once per 64
// rows). Every value's sum runs over o = 0, 1, ... in order from zero, so a row's gradient never
// depends on the other rows or on where the tiles fall.
#define BWD_TILE 64
#define BWD_K 16
template <typename W>
__device__ __forceinline__ void linear_backward_input(const float *__restrict__ dy, const W *__restrict__ w,
                                                      float *__restrict__ dx, int rows, int inp, int out) {
    __shared__ float gs[BWD_K][BWD_TILE + 1];
    __shared__ float ws[BWD_K][BWD_TILE];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * BWD_TILE, col0 = blockIdx.x * BWD_TILE;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < out; k0 += BWD_K) {
        for (int l = threadIdx.x; l < BWD_TILE * BWD_K; l += blockDim.x) {
            const int r = l / BWD_K, k = l % BWD_K;
            const int gr = row0 + r, gk = k0 + k;
            gs[k][r] = (gr < rows && gk < out) ? dy[(size_t)gr * out + gk] : 0.0f;
        }
        for (int l = threadIdx.x; l < BWD_K * BWD_TILE; l += blockDim.x) {
            const int k = l / BWD_TILE, c = l % BWD_TILE;
            const int gk = k0 + k, gc = col0 + c;
            ws[k][c] = (gk < out && gc < inp) ? load1(w + (size_t)gk * inp, gc) : 0.0f;
        }
        __syncthreads();
        const int kmax = min(BWD_K, out - k0);
        for (int k = 0; k < kmax; k++) {
            float g[4], v[4];
            for (int i = 0; i < 4; i++) g[i] = gs[k][ty * 4 + i];
            for (int j = 0; j < 4; j++) v[j] = ws[k][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(g[i], v[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        const int r = row0 + ty * 4 + i;
        if (r >= rows) continue;
        for (int j = 0; j < 4; j++) {
            const int c = col0 + tx * 4 + j;
            if (c < inp) dx[(size_t)r * inp + c] += acc[i][j];
        }
    }
}
extern "C" __global__ void linear_backward_input_f32(const float *__restrict__ dy, const float *__restrict__ w,
                                                    float *__restrict__ dx, int rows, int inp, int out) {
    linear_backward_input(dy, w, dx, rows, inp, out);
}
extern "C" __global__ void linear_backward_input_bf16(const float *__restrict__ dy,
                                                     const unsigned short *__restrict__ w,
                                                     float *__restrict__ dx, int rows, int inp, int out) {
    linear_backward_input(dy, w, dx, rows, inp, out);
}

// dW (out × inp) += dyᵀ · x over the rows in order (full-parameter training). Thread per weight.
extern "C" __global__ void weight_gradient(const float *__restrict__ dy, const float *__restrict__ x,
                                          float *__restrict__ dw, int rows, int inp, int out) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)out * inp) return;
    const int o = index / inp, i = index % inp;
    float sum = dw[index];
    for (int r = 0; r < rows; r++) sum = fmaf(dy[(size_t)r * out + o], x[(size_t)r * inp + i], sum);
    dw[index] = sum;
}

// d_bias (out) += Σ_r dy[r], the rows in order. Thread per column.
extern "C" __global__ void bias_gradient(const float *__restrict__ dy, float *__restrict__ d_bias, int rows,
                                        int out) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out) return;
    float sum = d_bias[o];
    for (int r = 0; r < rows; r++) sum += dy[(size_t)r * out + o];
    d_bias[o] = sum;
}

// The backward of the embedding lookup: d_table[indices[r]] += d_x[r], the rows in order (a
// token twice in a batch adds twice, in row order). Thread per column.
extern "C" __global__ void embed_backward(const int *__restrict__ indices, const float *__restrict__ d_x,
                                         float *__restrict__ d_table, int rows, int width) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int r = 0; r < rows; r++) {
        d_table[(size_t)indices[r] * width + j] += d_x[(size_t)r * width + j];
    }
}

// out[r] = log_softmax(logits[r])[targets[r]]. Block per row.
extern "C" __global__ void target_logprobs(const float *__restrict__ logits, const int *__restrict__ targets,
                                          float *__restrict__ out, int vocab) {
    const float *row = logits + (size_t)blockIdx.x * vocab;
    const float log_sum = row_log_sum_exp(row, vocab);
    if (threadIdx.x == 0) out[blockIdx.x] = row[targets[blockIdx.x]] - log_sum;
}

// The backward of target_logprobs: d_logits[r] = g[r] · (onehot(targets[r]) - softmax(logits[r])).
// Block per row.
extern "C" __global__ void target_logprobs_backward(const float *__restrict__ logits,
                                                   const int *__restrict__ targets,
                                                   const float *__restrict__ g, float *__restrict__ d_logits,
                                                   int vocab) {
    const size_t base = (size_t)blockIdx.x * vocab;
    const float log_sum = row_log_sum_exp(logits + base, vocab);
    const float scale = g[blockIdx.x];
    const int target = targets[blockIdx.x];
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float d = -scale * expf(logits[base + i] - log_sum);
        d_logits[base + i] = i == target ? d + scale : d;
    }
}

// c (m × n) = alpha · op(a) · op(b), or c += that when accumulate: op(a) is m × k (a stored
// k × m when a_t), op(b) is k × n (b stored n × k when b_t); each operand starts at its offset.
// Thread per value of c, the k terms added in order: the small products of LoRA's backward,
// where a segment's rows must not mix with another's.
extern "C" __global__ void small_gemm(const float *__restrict__ a, size_t a_offset, const float *__restrict__ b,
                                     size_t b_offset, float *__restrict__ c, size_t c_offset, int m, int n,
                                     int k, int a_t, int b_t, float alpha, int accumulate) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)m * n) return;
    const int i = index / n, j = index % n;
    const float *pa = a + a_offset;
    const float *pb = b + b_offset;
    float sum = 0.0f;
    for (int t = 0; t < k; t++) {
        const float left = a_t ? pa[(size_t)t * m + i] : pa[(size_t)i * k + t];
        const float right = b_t ? pb[(size_t)j * k + t] : pb[(size_t)t * n + j];
        sum = fmaf(left, right, sum);
    }
    float *out = c + c_offset + index;
    *out = accumulate ? *out + alpha * sum : alpha * sum;
}

// ---- Training attention: whole sequences, no cache ----
// q (rows × heads × head_dim), k and v (rows × kv_heads × head_dim), the rows being sequences
// one after another; starts[r] is the first row of row r's sequence, so row r attends to keys
// starts[r]..=r (the last `window` of them where window > 0: see first_key). The forward keeps each (row, head)'s log-sum-exp of its scaled scores; the
// backward recomputes the probabilities from it, so no positions × positions matrix is kept.

// The first key row that query row r sees.
__device__ int first_key(const int *__restrict__ starts, int r, int window) {
    return window > 0 ? max(starts[r], r + 1 - window) : starts[r];
}

// The scaled scores of query (r, h) against keys first_key(r)..=r into scores[], by warps;
// returns how many. Every thread of the block calls it.
__device__ int train_scores(const float *__restrict__ q, const float *__restrict__ k, const int *__restrict__ starts,
                            float *scores, int r, int h, int heads, int kv_heads, int head_dim, int window,
                            float scale) {
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv_head = h / (heads / kv_heads);
    const int first = first_key(starts, r, window), n = r - first + 1;
    const float *query = q + ((size_t)r * heads + h) * head_dim;
    for (int p = warp; p < n; p += warps) {
        const float *key = k + ((size_t)(first + p) * kv_heads + kv_head) * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s = fmaf(query[d], key[d], s);
        s = warp_sum(s);
        if (lane == 0) scores[p] = s * scale;
    }
    __syncthreads();
    return n;
}

// Block per (row, head): out and lse. As crate::attention_forward.
extern "C" __global__ void attention_train_forward(const float *__restrict__ q, const float *__restrict__ k,
                                                  const float *__restrict__ v, const int *__restrict__ starts,
                                                  float *__restrict__ out, float *__restrict__ lse, int heads,
                                                  int kv_heads, int head_dim, int window, float scale) {
    extern __shared__ float scores[];
    __shared__ float reduce[ATTENTION_THREADS];
    const int r = blockIdx.x, h = blockIdx.y;
    const int n = train_scores(q, k, starts, scores, r, h, heads, kv_heads, head_dim, window, scale);
    float m;
    const float total = exponentiate_scores(scores, n, reduce, &m);
    const int kv_head = h / (heads / kv_heads), first = first_key(starts, r, window);
    float *o = out + ((size_t)r * heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < n; ++p) {
            acc = fmaf(scores[p] / total, v[((size_t)(first + p) * kv_heads + kv_head) * head_dim + d], acc);
        }
        o[d] = acc;
    }
    if (threadIdx.x == 0) lse[(size_t)r * heads + h] = m + logf(total);
}

// The query side of the backward, block per (row, head): dq = scale · Σ_j dS_j k_j with
// P_j = exp(s_j - lse), dS_j = P_j (dO · v_j - dO · O). Writes dq.
extern "C" __global__ void attention_train_backward_q(const float *__restrict__ q, const float *__restrict__ k,
                                                     const float *__restrict__ v, const float *__restrict__ out,
                                                     const float *__restrict__ lse,
                                                     const float *__restrict__ d_out,
                                                     const int *__restrict__ starts, float *__restrict__ dq,
                                                     int heads, int kv_heads, int head_dim, int window,
                                                     float scale) {
    extern __shared__ float scores[];
    __shared__ float reduce[ATTENTION_THREADS];
    const int r = blockIdx.x, h = blockIdx.y;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = train_scores(q, k, starts, scores, r, h, heads, kv_heads, head_dim, window, scale);
    const int kv_head = h / (heads / kv_heads), first = first_key(starts, r, window);
    const size_t at = ((size_t)r * heads + h) * head_dim;
    float partial = 0.0f;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) partial = fmaf(d_out[at + d], out[at + d], partial);
    const float delta = block_sum(partial, reduce);
    const float row_lse = lse[(size_t)r * heads + h];
    for (int p = warp; p < n; p += warps) {
        const float *value = v + ((size_t)(first + p) * kv_heads + kv_head) * head_dim;
        float dp = 0.0f;
        for (int d = lane; d < head_dim; d += 32) dp = fmaf(d_out[at + d], value[d], dp);
        dp = warp_sum(dp);
        if (lane == 0) scores[p] = expf(scores[p] - row_lse) * (dp - delta);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < n; ++p) {
            acc = fmaf(scores[p], k[((size_t)(first + p) * kv_heads + kv_head) * head_dim + d], acc);
        }
        dq[at + d] = acc * scale;
    }
}

// The key and value side, block per (key row, kv head): over the group's query heads and the
// query rows that see the key (j..end of its sequence, or of its window), in order,
// dv_j = Σ P dO and dk_j = scale · Σ dS q. ends[j] is one past the last row of row j's
// sequence. Writes dk, dv.
extern "C" __global__ void attention_train_backward_kv(const float *__restrict__ q, const float *__restrict__ k,
                                                      const float *__restrict__ v, const float *__restrict__ out,
                                                      const float *__restrict__ lse,
                                                      const float *__restrict__ d_out,
                                                      const int *__restrict__ ends, float *__restrict__ dk,
                                                      float *__restrict__ dv, int heads, int kv_heads,
                                                      int head_dim, int window, float scale) {
    __shared__ float reduce[ATTENTION_THREADS];
    const int j = blockIdx.x, kv_head = blockIdx.y, group = heads / kv_heads;
    const int end = window > 0 ? min(ends[j], j + window) : ends[j];
    const size_t kv_at = ((size_t)j * kv_heads + kv_head) * head_dim;
    // Each thread owns dimensions d = threadIdx.x, + blockDim.x, ... (head_dim <= 4 · blockDim).
    float dk_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dv_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int g = 0; g < group; ++g) {
        const int h = kv_head * group + g;
        for (int i = j; i < end; ++i) {
            const size_t at = ((size_t)i * heads + h) * head_dim;
            float s = 0.0f, dp = 0.0f, delta = 0.0f;
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
                s = fmaf(q[at + d], k[kv_at + d], s);
                dp = fmaf(d_out[at + d], v[kv_at + d], dp);
                delta = fmaf(d_out[at + d], out[at + d], delta);
            }
            s = block_sum(s, reduce);
            dp = block_sum(dp, reduce);
            delta = block_sum(delta, reduce);
            const float p = expf(s * scale - lse[(size_t)i * heads + h]);
            const float ds = p * (dp - delta);
            for (int c = 0, d = threadIdx.x; c < 4 && d < head_dim; ++c, d += blockDim.x) {
                dv_acc[c] = fmaf(p, d_out[at + d], dv_acc[c]);
                dk_acc[c] = fmaf(ds, q[at + d], dk_acc[c]);
            }
        }
    }
    for (int c = 0, d = threadIdx.x; c < 4 && d < head_dim; ++c, d += blockDim.x) {
        dk[kv_at + d] = dk_acc[c] * scale;
        dv[kv_at + d] = dv_acc[c];
    }
}

// dx[r] += g[r] · j[r] for rows of `width`: the fused unembedding's backward through its saved
// Jacobians. Thread per value.
extern "C" __global__ void add_scaled_rows(float *__restrict__ dx, const float *__restrict__ j,
                                          const float *__restrict__ g, size_t n, int width) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = fmaf(g[i / width], j[i], dx[i]);
}

// ---- Drawing tokens on the device: one block of DRAW_THREADS per draw ----
//
// A draw picks a token from one row of logits as the host's `choose` does: at a temperature t > 0
// from softmax(logits / t), cut to the top k and then to the smallest most-likely prefix whose
// mass reaches top_p, drawn in most-likely order when cut and in id order when not; at t = 0 the
// row's argmax. Tokens are ordered by a key, larger first: the logprob's bits in a total order
// (Rust's total_cmp), then the id, lower first, so every token has a key of its own and "the
// tokens whose key is at least K" is a most-likely prefix. The cut, the draw and the most likely
// tokens each find the largest K for which a property of that prefix holds, one key bit at a time
// (a radix search, one pass over the row per bit): no sort, no atomics, and a draw's result
// depends on its row and its parameters alone.

#define DRAW_THREADS 256

// One row being drawn from: logprob(i) = row[i] · scale - log_sum, as the host computes it.
struct DrawRow {
    const float *row;
    int n;
    int id_bits;  // bits of the id part of a key: n - 1 fits in them
    float scale;
    float log_sum;

    __device__ float logprob(int i) const { return row[i] * scale - log_sum; }

    __device__ unsigned long long key(int i) const {
        const unsigned int bits = __float_as_uint(logprob(i));
        const unsigned int ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
        return ((unsigned long long)ordered << id_bits) | (unsigned long long)(n - 1 - i);
    }

    __device__ int id(unsigned long long key) const {
        return n - 1 - (int)(key & ((1ull << id_bits) - 1));
    }
};

// The count and mass of the tokens whose key is at least k: exp of the logprob in f64 when
// `wide`, else the f32 exp widened (as the host's top-p cut sums it). Every thread gets both.
__device__ void prefix_stats(const DrawRow &r, unsigned long long k, bool wide, int *count,
                             double *mass) {
    __shared__ double mass_scratch[DRAW_THREADS];
    __shared__ int count_scratch[DRAW_THREADS];
    int c = 0;
    double m = 0.0;
    for (int i = threadIdx.x; i < r.n; i += blockDim.x) {
        if (r.key(i) >= k) {
            const float lp = r.logprob(i);
            ++c;
            m += wide ? exp((double)lp) : (double)expf(lp);
        }
    }
    *count = block_sum(c, count_scratch);
    *mass = block_sum(m, mass_scratch);
}

// The largest key K for which holds(count, mass) of the prefix from K on, where holding can only
// stop as K grows; keys up to `floor` hold without a pass. 0 when none above the floor holds.
template <typename Holds>
__device__ unsigned long long largest_key(const DrawRow &r, bool wide, unsigned long long floor,
                                          Holds holds) {
    unsigned long long k = 0;
    for (int b = 31 + r.id_bits; b >= 0; --b) {
        const unsigned long long trial = k | (1ull << b);
        if (trial <= floor) {
            k = trial;
            continue;
        }
        int count;
        double mass;
        prefix_stats(r, trial, wide, &count, &mass);
        if (holds(count, mass)) k = trial;
    }
    return k;
}

// The token at which the running mass (f64 exps, in id order) first passes uniform · the row's
// mass: the row split in contiguous chunks, one per thread, summed, and walked by thread 0.
__device__ int draw_in_id_order(const DrawRow &r, double uniform) {
    __shared__ double chunk_mass[DRAW_THREADS];
    __shared__ int drawn;
    const int chunk = (r.n + blockDim.x - 1) / blockDim.x;
    const int begin = min(r.n, (int)threadIdx.x * chunk);
    const int end = min(r.n, begin + chunk);
    double own = 0.0;
    for (int i = begin; i < end; ++i) own += exp((double)r.logprob(i));
    chunk_mass[threadIdx.x] = own;
    __syncthreads();
    if (threadIdx.x == 0) {
        double mass = 0.0;
        for (int t = 0; t < blockDim.x; ++t) mass += chunk_mass[t];
        const double target = uniform * mass;
        double running = 0.0;
        int t = 0;
        while (t + 1 < (int)blockDim.x && running + chunk_mass[t] <= target) running += chunk_mass[t++];
        drawn = r.n - 1;
        for (int i = min(r.n, t * chunk); i < r.n; ++i) {
            running += exp((double)r.logprob(i));
            if (running > target) {
                drawn = i;
                break;
            }
        }
    }
    __syncthreads();
    return drawn;
}

// Writes the tokens whose key is at least k, in id order, with their logprobs.
__device__ void gather_prefix(const DrawRow &r, unsigned long long k, int *ids, float *logprobs) {
    __shared__ int offsets[DRAW_THREADS];
    const int chunk = (r.n + blockDim.x - 1) / blockDim.x;
    const int begin = min(r.n, (int)threadIdx.x * chunk);
    const int end = min(r.n, begin + chunk);
    int own = 0;
    for (int i = begin; i < end; ++i) own += r.key(i) >= k;
    offsets[threadIdx.x] = own;
    __syncthreads();
    if (threadIdx.x == 0) {
        int running = 0;
        for (int t = 0; t < blockDim.x; ++t) {
            const int c = offsets[t];
            offsets[t] = running;
            running += c;
        }
    }
    __syncthreads();
    int at = offsets[threadIdx.x];
    for (int i = begin; i < end; ++i) {
        if (r.key(i) >= k) {
            ids[at] = i;
            logprobs[at] = r.logprob(i);
            ++at;
        }
    }
    __syncthreads();
}

// Draw d from row rows[d] of logits (n wide): scales[d] is 1 / temperature, or below 0 for the
// argmax; top_k[d] = n keeps every token; tops[d] most likely tokens go to top_ids / top_logprobs
// (max_top per draw, in id order). tokens[d] and logprobs[d] get the token and its logprob under
// softmax(logits · scale) (under softmax(logits) for the argmax). Block per draw.
extern "C" __global__ void draw_tokens(const float *__restrict__ logits, int n, int id_bits,
                                       const int *__restrict__ rows, const float *__restrict__ scales,
                                       const int *__restrict__ top_k, const double *__restrict__ top_p,
                                       const double *__restrict__ uniforms, const int *__restrict__ tops,
                                       int max_top, int *__restrict__ tokens, float *__restrict__ logprobs,
                                       int *__restrict__ top_ids, float *__restrict__ top_logprobs) {
    const int d = blockIdx.x;
    const float *row = logits + (size_t)rows[d] * n;
    const bool greedy = scales[d] < 0.0f;
    const float scale = greedy ? 1.0f : scales[d];
    const DrawRow r{row, n, id_bits, scale, row_log_sum_exp(row, n, scale)};
    int token;
    if (greedy) {
        token = row_argmax(row, n);
    } else if (top_k[d] < n || top_p[d] < 1.0) {
        const int k = top_k[d];
        const double p = top_p[d];
        // The cut: the shortest prefix that holds k tokens or reaches mass p.
        const unsigned long long cut =
            largest_key(r, false, 0, [&](int count, double mass) { return count >= k || mass >= p; });
        int kept;
        double kept_mass;
        prefix_stats(r, cut, false, &kept, &kept_mass);
        const double target = uniforms[d] * kept_mass;
        // The draw, in most-likely order: the first token whose prefix mass passes the target
        // (the cut's last token when rounding leaves none).
        const unsigned long long drawn =
            largest_key(r, true, cut, [&](int, double mass) { return mass > target; });
        token = r.id(drawn);
    } else {
        token = draw_in_id_order(r, uniforms[d]);
    }
    if (threadIdx.x == 0) {
        tokens[d] = token;
        logprobs[d] = r.logprob(token);
    }
    const int top = tops[d];
    if (top > 0) {
        const unsigned long long from =
            largest_key(r, false, 0, [&](int count, double) { return count >= top; });
        gather_prefix(r, from, top_ids + (size_t)d * max_top, top_logprobs + (size_t)d * max_top);
    }
}
