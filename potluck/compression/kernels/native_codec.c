/* potluck's native CPU codec kernels, loaded through ctypes by kernels/native.py.
 *
 * One pass over the input per block of `block` elements: add the error-feedback residual, find the
 * block's absmax, derive the bf16-rounded-up scale, quantize, write the new residual, pack the codes
 * planar and run CRC32C over the packed bytes while they are still in L1. The rules are those of
 * quantize.py (its docstring is the specification); this file must give the same bits as the torch
 * reference, the Triton kernels and every other build of itself. Hence:
 *   - only IEEE-exact operations: fp32 add, multiply, divide (never a reciprocal), floor, trunc;
 *   - built with -ffp-contract=off and without -ffast-math, so no FMA and no flush-to-zero;
 *   - the absmax compares the magnitude bit patterns as integers, which orders finite values as
 *     floats do and puts every NaN and Inf at or above 0x7f800000, so one compare finds them.
 * Each call covers blocks [b0, b1) of a tensor of n elements, so Python can split a tensor across
 * threads (ctypes releases the GIL) and combine the per-range CRCs with plk_crc32c_combine.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#define PLK_CRC_HW "sse4.2"
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define PLK_CRC_HW "armv8-crc"
#else
#define PLK_CRC_HW "table"
#endif

#define PLK_ABI 1
#define BF16_MAX_BITS 0x7F7F0000u
#define GOLDEN32 0x9E3779B1u
#define FMIX_C1 0x85EBCA6Bu
#define FMIX_C2 0xC2B2AE35u
#define MAX_BLOCK 4096
#define CRC_POLY 0x82F63B78u /* Castagnoli, bit-reflected */

int plk_abi(void) { return PLK_ABI; }
const char *plk_crc_impl(void) { return PLK_CRC_HW; }

/* ---- CRC32C ------------------------------------------------------------------------------------ */
#if !defined(__SSE4_2__) && !defined(__ARM_FEATURE_CRC32)
static uint32_t crc_table[8][256];
static int crc_table_ready;

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC_POLY : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
    crc_table_ready = 1;
}
#endif

/* One step of the raw register (no pre/post inversion) over 8 bytes, and over 1 byte. */
#if defined(__SSE4_2__)
#define CRC8(c, v) ((uint32_t)_mm_crc32_u64((c), (v)))
#define CRC1(c, b) _mm_crc32_u8((c), (b))
#elif defined(__ARM_FEATURE_CRC32)
#define CRC8(c, v) __crc32cd((c), (v))
#define CRC1(c, b) __crc32cb((c), (b))
#else
static inline uint32_t crc8_table(uint32_t c, uint64_t v) {
    if (!crc_table_ready) crc_table_init();
    v ^= c;
    return crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^ crc_table[5][(v >> 16) & 0xff] ^
           crc_table[4][(v >> 24) & 0xff] ^ crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
           crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
}
#define CRC8(c, v) crc8_table((c), (v))
#define CRC1(c, b) ((crc_table_ready ? 0 : (crc_table_init(), 0)), (c) >> 8 ^ crc_table[0][((c) ^ (b)) & 0xff])
#endif

/* The raw register over n bytes. */
static inline uint32_t crc_update(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = CRC8(c, v);
        p += 8;
        n -= 8;
    }
    while (n--) c = CRC1(c, *p++);
    return c;
}

/* Product of two polynomials modulo the CRC polynomial, in the reflected bit order (bit 31 = x^0). */
static uint32_t gf2_mulmod(uint32_t a, uint32_t b) {
    uint32_t prod = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) prod ^= b;
        b = b & 1 ? (b >> 1) ^ CRC_POLY : b >> 1;
    }
    return prod;
}

/* x^(8 * nbytes) modulo the polynomial: the operator that moves a CRC register past nbytes zeros. */
static uint32_t shift_op(uint64_t nbytes) {
    uint32_t result = 1u << 31; /* the polynomial 1 */
    uint32_t sq = 1u << 23;     /* x^8: one byte */
    while (nbytes) {
        if (nbytes & 1) result = gf2_mulmod(sq, result);
        sq = gf2_mulmod(sq, sq);
        nbytes >>= 1;
    }
    return result;
}

/* CRC32C of A || B from crc(A), crc(B) and len(B), for standard (inverted) CRC values. */
uint32_t plk_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    return gf2_mulmod(shift_op(len_b), crc_a) ^ crc_b;
}

/* The raw register over n bytes in 12 KiB strides of three interleaved 4 KiB chains, since one chain
 * waits on each instruction's 3-cycle latency; `op` is shift_op(4096). */
#define STRIDE 4096
static uint32_t crc_update3(uint32_t c, const uint8_t *p, uint64_t n, uint32_t op) {
    while (n >= 3 * STRIDE) {
        uint32_t a = c, b = 0, d = 0;
        for (int i = 0; i < STRIDE; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + STRIDE + i, 8);
            memcpy(&v2, p + 2 * STRIDE + i, 8);
            a = CRC8(a, v0);
            b = CRC8(b, v1);
            d = CRC8(d, v2);
        }
        c = gf2_mulmod(op, gf2_mulmod(op, a) ^ b) ^ d;
        p += 3 * STRIDE;
        n -= 3 * STRIDE;
    }
    return crc_update(c, p, (size_t)n);
}

/* Standard CRC32C continuing from `crc` (0 to start), like zlib.crc32's second argument. */
uint32_t plk_crc32c(uint32_t crc, const uint8_t *p, uint64_t n) {
    return ~crc_update3(~crc, p, n, shift_op(STRIDE));
}

/* ---- quantize + pack + CRC --------------------------------------------------------------------- */
static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Eight lanes in GCC/Clang vector extensions: SSE/AVX on x86-64, NEON on ARM, scalar elsewhere.
 * The compiler did not vectorise the scalar loop (the rounding's control flow), and every operation
 * below is exact or IEEE-rounded lane by lane, so the bits are those of the scalar rule. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

static inline v8f ld8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline v8f sel(v8i mask, v8f a, v8f b) { /* mask lanes are all ones or all zeros */
    return (v8f)(((v8i)a & mask) | ((v8i)b & ~mask));
}

/* The residual bypasses the cache where the CPU allows (x86 streaming stores): it is read again only
 * at the next step, long after it would have left the cache, and a normal store first reads every
 * destination line (a third more memory traffic than the encode's own reads). */
static inline void store_resid(float *dst, const float *src, int m, int block) {
#if defined(__AVX__)
    if (m == block && ((uintptr_t)dst & 31) == 0) {
        for (int j = 0; j < block; j += 8) _mm256_stream_ps(dst + j, _mm256_load_ps(src + j));
        return;
    }
#elif defined(__SSE2__)
    if (m == block && ((uintptr_t)dst & 15) == 0) {
        for (int j = 0; j < block; j += 4) _mm_stream_ps(dst + j, _mm_load_ps(src + j));
        return;
    }
#endif
    memcpy(dst, src, (size_t)m * sizeof(float));
}

static inline __attribute__((always_inline)) int quant_range(
    const float *g, const float *e, float *resid, int64_t n, int64_t b0, int64_t b1, const int block,
    const int bits, const int sto, const int has_e, const int want_r, uint32_t lo, uint32_t hi,
    int64_t start, uint8_t *scales, uint8_t *codes, uint32_t *crcs) {
    const int qmax = (1 << (bits - 1)) - 1, half = 1 << (bits - 1), k = 8 / bits, run = block / k;
    const float fq = (float)qmax;
    /* A superblock of MAX_BLOCK elements (64 blocks of 64) goes through three passes in L1: load and
     * absmax, then every block's scale (independent scalar chains that overlap, where one block at a
     * time waited ~40 cycles on its divide), then quantize, pack and CRC. */
    const int per = MAX_BLOCK / block;
    float x[MAX_BLOCK] __attribute__((aligned(64)));
    int32_t u[MAX_BLOCK] __attribute__((aligned(64))); /* narrowed in the packing loop, which the
                                                          compiler vectorises with pack instructions */
    uint32_t amaxs[MAX_BLOCK / 32];
    float ss[MAX_BLOCK / 32], sds[MAX_BLOCK / 32];
    uint32_t crc_s = ~0u, crc_c = ~0u;
    const uint32_t op = shift_op(STRIDE);
    const uint8_t *pending = codes + b0 * (int64_t)run; /* code bytes written, not yet in crc_c */
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t s0 = b0; s0 < b1; s0 += per) {
        const int nblk = b1 - s0 < per ? (int)(b1 - s0) : per;
        for (int i = 0; i < nblk; i++) { /* pass 1: x = g (+ e), the block's absmax bits */
            const int64_t base = (s0 + i) * (int64_t)block;
            const int m = n - base < block ? (int)(n - base) : block; /* the last block may be short */
            const float *gp = g + base;
            const float *ep = has_e ? e + base : NULL;
            float *xp = x + i * block;
            v8i vmax = {0};
            if (m == block) {
                for (int j = 0; j < block; j += 8) {
                    const v8f v = has_e ? ld8(gp + j) + ld8(ep + j) : ld8(gp + j);
                    const v8i a = (v8i)v & 0x7FFFFFFF; /* magnitude bits: ordered as the floats are */
                    vmax = (v8i)sel(a > vmax, (v8f)a, (v8f)vmax);
                    memcpy(xp + j, &v, sizeof v);
                }
            } else {
                for (int j = 0; j < m; j++) xp[j] = has_e ? gp[j] + ep[j] : gp[j];
                for (int j = m; j < block; j++) xp[j] = 0.0f;
                for (int j = 0; j < block; j += 8) {
                    const v8i a = (v8i)ld8(xp + j) & 0x7FFFFFFF;
                    vmax = (v8i)sel(a > vmax, (v8f)a, (v8f)vmax);
                }
            }
            uint32_t amax = 0;
            for (int l = 0; l < 8; l++) amax = (uint32_t)vmax[l] > amax ? (uint32_t)vmax[l] : amax;
            amaxs[i] = amax;
        }
        for (int i = 0; i < nblk; i++) { /* pass 2: scales */
            if (amaxs[i] >= 0x7F800000u) return 0; /* NaN or Inf: the caller decides what to send */
            uint32_t sb = f2u(u2f(amaxs[i]) / fq);
            sb = sb > BF16_MAX_BITS ? BF16_MAX_BITS : sb;
            sb = (sb + 0xFFFFu) & 0xFFFF0000u; /* round the scale up to bf16, so |x / s| <= qmax */
            ss[i] = u2f(sb);
            sds[i] = ss[i] > 0.0f ? ss[i] : 1.0f;
            const int64_t b = s0 + i;
            scales[2 * b] = (uint8_t)((sb >> 16) & 0xFF);
            scales[2 * b + 1] = (uint8_t)(sb >> 24);
        }
        crc_s = crc_update(crc_s, scales + 2 * s0, 2 * (size_t)nblk);
        for (int i = 0; i < nblk; i++) { /* pass 3: codes, residual, packing */
            const int64_t b = s0 + i, base = b * (int64_t)block;
            const int m = n - base < block ? (int)(n - base) : block;
            float *xp = x + i * block;
            const float s = ss[i], sd = sds[i];
            const v8f vs = {s, s, s, s, s, s, s, s}, vsd = {sd, sd, sd, sd, sd, sd, sd, sd};
            for (int j = 0; j < block; j += 8) {
                const v8f xv = ld8(xp + j);
                const v8f y = xv / vsd; /* IEEE division; |y| <= qmax + 1, so int conversions are exact */
                v8i qi;
                if (sto) {
                    v8u h = ((((v8u)(lane + (int32_t)(uint32_t)(start + base + j))) ^ lo) * GOLDEN32) + hi;
                    h ^= h >> 16;
                    h *= FMIX_C1;
                    h ^= h >> 13;
                    h *= FMIX_C2;
                    h ^= h >> 16;
                    const v8f z = y + __builtin_convertvector((v8i)(h >> 8), v8f) * 0x1p-24f;
                    const v8i t = __builtin_convertvector(z, v8i); /* truncates toward zero */
                    qi = t + (v8i)(z < __builtin_convertvector(t, v8f)); /* floor: minus 1 below zero */
                } else {
                    const v8i nonneg = (v8i)(y >= 0.0f);
                    const v8f halfs = sel(nonneg, (v8f){0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f},
                                          (v8f){-0.5f, -0.5f, -0.5f, -0.5f, -0.5f, -0.5f, -0.5f, -0.5f});
                    qi = __builtin_convertvector(y + halfs, v8i); /* round half away from zero */
                }
                v8i low = qi < -qmax, high = qi > qmax; /* lanes of all ones where true */
                qi = (qi & ~low) | (-qmax & low);
                qi = (qi & ~high) | (qmax & high);
                if (want_r) {
                    const v8f r = xv - __builtin_convertvector(qi, v8f) * vs; /* exact product, one rounding */
                    memcpy(xp + j, &r, sizeof r);
                }
                const v8i uq = qi + half;
                memcpy(u + j, &uq, sizeof uq);
            }
            if (want_r) store_resid(resid + base, xp, m, block);
            uint8_t *cp = codes + b * (int64_t)run;
            for (int j = 0; j < run; j++) { /* planar: byte j holds elements j, j + run, j + 2 run, ... */
                int32_t v = u[j];
                for (int l = 1; l < k; l++) v |= u[j + l * run] << (bits * l);
                cp[j] = (uint8_t)v;
            }
            if (cp + run - pending >= 3 * STRIDE) { /* the last 12 KiB of codes are still in L1 */
                crc_c = crc_update3(crc_c, pending, 3 * STRIDE, op);
                pending += 3 * STRIDE;
            }
        }
    }
    crc_c = crc_update3(crc_c, pending, (uint64_t)(codes + b1 * (int64_t)run - pending), op);
#if defined(__SSE2__)
    if (want_r) _mm_sfence(); /* streaming stores are visible to other threads after a fence */
#endif
    crcs[0] = ~crc_s;
    crcs[1] = ~crc_c;
    return 1;
}

#define QR(BITS, STO, HE, WR) \
    quant_range(g, e, resid, n, b0, b1, block, BITS, STO, HE, WR, lo, hi, start, scales, codes, crcs)
#define QR_BITS(STO, HE, WR) \
    (bits == 8 ? QR(8, STO, HE, WR) : bits == 4 ? QR(4, STO, HE, WR) : QR(2, STO, HE, WR))
#define QR_WR(STO, HE) (want_r ? QR_BITS(STO, HE, 1) : QR_BITS(STO, HE, 0))
#define QR_HE(STO) (e ? QR_WR(STO, 1) : QR_WR(STO, 0))

/* Quantize blocks [b0, b1) of g (+ e) into `scales` (2 bytes per block) and `codes` (block * bits / 8
 * bytes per block), both indexed from block 0; write the residual to `resid` when want_r. Returns 1,
 * or 0 if a value is not finite; -1 on bad arguments. crcs[0], crcs[1]: CRC32C of the range's scale
 * and code bytes. `resid` may be `e` itself. */
int plk_quantize(const float *g, const float *e, float *resid, int64_t n, int64_t b0, int64_t b1, int block,
                 int bits, int sto, uint32_t lo, uint32_t hi, int64_t start, int want_r, uint8_t *scales,
                 uint8_t *codes, uint32_t *crcs) {
    if (block < 32 || block > MAX_BLOCK || (block & (block - 1)) || (bits != 8 && bits != 4 && bits != 2))
        return -1;
    if (b0 < 0 || b1 < b0 || b1 * (int64_t)block - n >= block || (want_r && !resid)) return -1;
    return sto ? QR_HE(1) : QR_HE(0);
}

/* ---- unpack + dequantize (+ accumulate) -------------------------------------------------------- */
static inline __attribute__((always_inline)) void dequant_range(const uint8_t *codes, const uint8_t *scales,
                                                                int64_t n, int64_t b0, int64_t b1, int block,
                                                                const int bits, float *out, const int acc) {
    const int half = 1 << (bits - 1), k = 8 / bits, run = block / k, mask = (1 << bits) - 1;
    float v[MAX_BLOCK] __attribute__((aligned(64)));
    for (int64_t b = b0; b < b1; b++) {
        const int64_t base = b * (int64_t)block;
        const int m = n - base < block ? (int)(n - base) : block;
        const float s = u2f(((uint32_t)scales[2 * b] | (uint32_t)scales[2 * b + 1] << 8) << 16);
        const uint8_t *cp = codes + b * (int64_t)run;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < run; j++) v[i * run + j] = (float)(((cp[j] >> (bits * i)) & mask) - half) * s;
        float *op = out + base;
        if (acc)
            for (int j = 0; j < m; j++) op[j] += v[j];
        else
            memcpy(op, v, (size_t)m * sizeof(float));
    }
}

/* Blocks [b0, b1) of a tensor of n elements into out (indexed from element 0); adds when acc. */
int plk_dequantize(const uint8_t *codes, const uint8_t *scales, int64_t n, int64_t b0, int64_t b1, int block,
                   int bits, float *out, int acc) {
    if (block < 32 || block > MAX_BLOCK || (block & (block - 1)) || (bits != 8 && bits != 4 && bits != 2))
        return -1;
    if (b0 < 0 || b1 < b0 || b1 * (int64_t)block - n >= block) return -1;
    if (bits == 8)
        acc ? dequant_range(codes, scales, n, b0, b1, block, 8, out, 1)
            : dequant_range(codes, scales, n, b0, b1, block, 8, out, 0);
    else if (bits == 4)
        acc ? dequant_range(codes, scales, n, b0, b1, block, 4, out, 1)
            : dequant_range(codes, scales, n, b0, b1, block, 4, out, 0);
    else
        acc ? dequant_range(codes, scales, n, b0, b1, block, 2, out, 1)
            : dequant_range(codes, scales, n, b0, b1, block, 2, out, 0);
    return 1;
}
