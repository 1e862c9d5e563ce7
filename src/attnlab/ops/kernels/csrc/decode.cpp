// The decode kernel (decode.h): flash-decoding over a key/value cache read as stored.
//
// One work item = (batch b, kv head hk, chunk of keys). Its R = G·L rows (the G query heads of hk,
// L rows each) walk the chunk in blocks of KB keys: every row's scores q·k from the block's key
// rows (read in place, converted in registers; a row that is not whole vectors or a float16 /
// non-exact bfloat16 key for several rows: converted once into L1 scratch), an online softmax,
// then O += P·V for all rows at once, each value vector loaded once per 4 rows. The K and V rows
// a block ahead are requested while a block is computed. Each cache row is read from memory once
// per step whatever G is. A head's chunks leave (O, m, l) partials; the calling thread merges
// them once every item is done: m = max m_c, l = Σ l_c·e^(m_c - m), O = Σ O_c·e^(m_c - m) / l,
// lse = m + log l. The caller never waits for a helper thread (run_shared).
#include "decode.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(ATTNLAB_AVX512)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "helpers.h"
#include "interval.h"
#include "queue.h"
#include "tiles.h"
#include "vec.h"

using at::Tensor;

namespace attnlab_k {
namespace {

// inlined whatever GCC's heuristics say (a call per key or a W-vector array spilled to memory)
#define ATTNLAB_INLINE inline __attribute__((always_inline))

constexpr int KB = 64;     // keys of one block (32 measured 5-10% slower for bfloat16 caches)
constexpr int RMAX = 64;   // rows of one item at most (a head group wider is split in items)

enum Dt { F32 = 0, BF16 = 1, F16 = 2 };

static inline float half_to_float(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t bits;
  if (e == 0x1f) {
    bits = s | 0x7f800000u | (m << 13);  // Inf / NaN
  } else if (e) {
    bits = s | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    bits = s;
  } else {  // subnormal: m · 2^-24 exactly
    float f = (float)m * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= s;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n values of type dt at src -> float32 at dst (whole vectors converted in registers)
static inline void to_float(const void* src, int dt, int n, float* dst) {
  int c = 0;
  if (dt == F32) {
    std::memcpy(dst, src, (size_t)n * 4);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
#if defined(ATTNLAB_AVX512)
  if (dt == BF16)
    for (; c + 16 <= n; c += 16)
      _mm512_storeu_ps(dst + c, _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(s + c))), 16)));
  else
    for (; c + 16 <= n; c += 16)
      _mm512_storeu_ps(dst + c, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + c))));
#elif defined(ATTNLAB_AVX2)
  if (dt == BF16)
    for (; c + 8 <= n; c += 8)
      _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(s + c))), 16)));
  else
    for (; c + 8 <= n; c += 8)
      _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + c))));
#endif
  for (; c < n; ++c) dst[c] = dt == BF16 ? bf16_to_float(s[c]) : half_to_float(s[c]);
}

// A cache tensor as the kernel reads it: rows of `n` elements, unit stride within a row.
struct Rows {
  const char* p;
  int dt, esize, n;
  int64_t sb, sh, ss;  // batch, head, row strides in elements
  const char* row(int64_t b, int64_t h, int64_t j) const {
    return p + (b * sb + h * sh + j * ss) * esize;
  }
};

struct Dec {
  int B, H, Hkv, L, S, D, Dv, DP, DvP;  // DP, DvP: head dims padded to whole vectors
  int G, GH, R, nsub;                   // heads per kv head, heads per item, rows per item
  const void* q;                        // (B, H, L, D) contiguous, of dtype qdt
  int qdt;
  Rows k, v;
  const int32_t *lo, *hi;  // null: every row attends [0, S)
  int Bl, Hl;
  int64_t lo_sb, lo_sh;
  const float* slopes;
  int64_t slope_sb;
  float scale, softcap;
  int pos_off;
  bool amx;  // bfloat16 keys' scores from the AMX tile unit (amx_ok, ATTNLAB_DECODE_AMX != "0")
  // bfloat16 values read even/odd (bf16eo): a partial O keeps each block of 2W columns as its W
  // even columns, then its W odd ones (o_col), put back in order by finish_group
  bool v_eo;
  int row_lo(int b, int h, int i) const { return lo ? lo[b * lo_sb + h * lo_sh + i] : 0; }
  int row_hi(int b, int h, int i) const { return hi ? hi[b * lo_sb + h * lo_sh + i] : S; }
  // a K (V) row read in place: float32 whose length is whole vectors
  bool k_direct() const { return k.dt == F32 && D == DP; }
  bool v_direct() const { return v.dt == F32 && Dv == DvP; }
};

// One head group (b, hk, sub): its rows' union of key intervals and where its chunks start.
struct Group {
  int b, hk, sub, klo, khi, nch;
  int64_t first_item;  // its first work item
};

size_t scratch_floats(const Dec& d) {
  // Kb (KB, DP), Vb (KB, DvP), Q (R, DP), S (R, KB), O (R, DvP), m, l, row bounds, Qh and Qt
  // (R, DP) bfloat16 each, the tile unit's scores (KB, R)
  return (size_t)KB * (d.DP + d.DvP) + (size_t)d.R * (d.DP + KB + d.DvP + 4) +
         (size_t)d.R * d.DP + (size_t)KB * d.R + 16;
}

// A cache element as stored: float, or the 16 bits of a bfloat16 / float16
struct bf16 { uint16_t x; };
struct f16 { uint16_t x; };
struct bf16dp { uint16_t x; };  // bfloat16 keys whose products come from AVX-512 BF16 (vdpbf16ps)
struct bf16eo { uint16_t x; };  // bfloat16 values read 2W at a time, split even / odd (vld_eo)

// where a partial O keeps column e (Dec::v_eo)
static inline int o_col(const Dec& d, int e) {
  if (!d.v_eo) return e;
  const int b = e / (2 * W) * (2 * W), j = e - b;
  return b + (j & 1) * W + (j >> 1);
}

// 2W bfloat16 values at p as two vectors of floats, one instruction each and no shuffle: the
// even-indexed values (e: each 32-bit lane's low half shifted up) and the odd-indexed ones (o:
// the high half, the low half cleared); vld's widening takes two, one of them a shuffle
static inline void vld_eo(const bf16eo* p, vf& e, vf& o) {
#if defined(ATTNLAB_AVX512)
  const __m512i x = _mm512_loadu_si512(p);
  e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
#elif defined(ATTNLAB_AVX2)
  const __m256i x = _mm256_loadu_si256((const __m256i*)p);
  e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
#else
  e = bf16_to_float(p[0].x);
  o = bf16_to_float(p[1].x);
#endif
}

// W elements at p as one vector of floats, converted in registers
static inline vf vld(const float* p) { return vload(p); }
#if defined(ATTNLAB_AVX512)
static inline vf vld(const bf16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline vf vld(const f16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline vf vld(const bf16dp* p) { return vld(reinterpret_cast<const bf16*>(p)); }

#elif defined(ATTNLAB_AVX2)
static inline vf vld(const bf16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline vf vld(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline vf vld(const bf16dp* p) { return vld(reinterpret_cast<const bf16*>(p)); }
#else
static inline vf vld(const bf16* p) { return bf16_to_float(p->x); }
static inline vf vld(const f16* p) { return half_to_float(p->x); }
static inline vf vld(const bf16dp* p) { return bf16_to_float(p->x); }
#endif

// Σ_c a[c]·b[c] over n (a multiple of W) elements: two chains, one horizontal sum
template <class T>
static inline float dot(const float* a, const T* b, int n) {
  vf s0 = vzero(), s1 = vzero();
  int c = 0;
  for (; c + 2 * W <= n; c += 2 * W) {
    s0 = vfma(vload(a + c), vld(b + c), s0);
    s1 = vfma(vload(a + c + W), vld(b + c + W), s1);
  }
  for (; c < n; c += W) s0 = vfma(vload(a + c), vld(b + c), s0);
  return hsum(vadd(s0, s1));
}

// lane t of the result = the sum of x[t]'s lanes: W horizontal sums in one tree of adds and
// shuffles (AVX-512: 45 instructions for 16 sums, where 16 reductions take ~130)
static inline vf hsum_lanes(vf* x) {
#if defined(ATTNLAB_AVX512)
  vf a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: x0+x2, y0+y2, x1+x3, y1+y3 of x[2i], x[2i+1]
    a[i] = vadd(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the partial sums of 4 keys, in order
    b[i] = vadd(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 2; ++i)  // lanes pairwise summed: two 128-bit lanes per 4 keys
    c[i] = vadd(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  return vadd(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
#elif defined(ATTNLAB_AVX2)
  vf a[4], b[2];
  for (int i = 0; i < 4; ++i)
    a[i] = vadd(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    b[i] = vadd(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return vadd(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
#else
  return x[0];
#endif
}

#if defined(ATTNLAB_AVX512)
#define ATTNLAB_BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
// q·k of bfloat16 q (exactly: a bfloat16 input's) and keys, pairs of products summed in fp32 by
// vdpbf16ps: 32 products an instruction, no conversion. s[t] for the nk <= 16 keys at kb, n
// (NC·32, or any multiple of 32 for NC = 0) elements each. One key's sum at a time over q's
// vectors held in registers, 16 accumulators in registers; keys past nk reread the last key
// (their lanes dropped), so the loop has one shape and reads nothing outside the block.
// Compiled for AVX-512 BF16 alone; called only where the CPU has it (cpu_has_bf16)
template <int NC>
ATTNLAB_BF16_TARGET static inline void dot_keys_dp_n(const uint16_t* q, const uint16_t* kb,
                                                     int64_t ldk, int n, float* s, int nk) {
  constexpr int QR = NC ? NC : 1;
  __m512bh qc[QR];
  if (NC)
    for (int c = 0; c < QR; ++c) qc[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) {
    const uint16_t* k = kb + (t < nk ? t : nk - 1) * ldk;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    if (NC) {
      for (int c = 0; c + 1 < QR; c += 2) {
        a0 = _mm512_dpbf16_ps(a0, qc[c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
        a1 = _mm512_dpbf16_ps(a1, qc[c + 1], (__m512bh)_mm512_loadu_si512(k + 32 * c + 32));
      }
      if (QR % 2)
        a0 = _mm512_dpbf16_ps(a0, qc[QR - 1], (__m512bh)_mm512_loadu_si512(k + 32 * QR - 32));
    } else {
      for (int c = 0; c < n; c += 32)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(q + c),
                              (__m512bh)_mm512_loadu_si512(k + c));
    }
    acc[t] = _mm512_add_ps(a0, a1);
  }
  if (nk == 16) {
    _mm512_storeu_ps(s, hsum_lanes(acc));
    return;
  }
  float tmp[16];
  _mm512_storeu_ps(tmp, hsum_lanes(acc));
  std::copy(tmp, tmp + nk, s);
}

ATTNLAB_BF16_TARGET static void dot_keys_dp(const uint16_t* q, const uint16_t* kb, int64_t ldk,
                                            int n, float* s, int nk) {
  switch (n / 32) {
    case 2: return dot_keys_dp_n<2>(q, kb, ldk, n, s, nk);
    case 4: return dot_keys_dp_n<4>(q, kb, ldk, n, s, nk);
    case 8: return dot_keys_dp_n<8>(q, kb, ldk, n, s, nk);
    default: return dot_keys_dp_n<0>(q, kb, ldk, n, s, nk);
  }
}

// The AMX tile unit (this build runs where the CPU has AVX-512; AMX is checked at run time):
// a block of KB = 64 bfloat16 keys against R <= 16 bfloat16 query rows, q·k as a (64, D) x
// (D, R) product of bfloat16 pairs summed in fp32 (exact products, as vdpbf16ps), off the
// vector units that the softmax and P·V keep busy
#define ATTNLAB_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// whether the CPU has AMX-BF16 and Linux lets this process use the tile registers (asked once)
bool amx_ok() {
  static const bool ok = [] {
    unsigned a, b, c, dd;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &dd)) return false;
    if (!((dd >> 22) & 1) || !((dd >> 24) & 1)) return false;  // AMX-BF16, AMX-TILE
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }();
  return ok;
}

// tiles 0-3: the scores of keys 16g.. (16, R) fp32; 4, 5: 16 key rows x 32 bfloat16; 6: 32 dims
// of Q^T as (16 pairs, R rows, 2)
ATTNLAB_AMX_TARGET static void amx_config(int R) {
  alignas(64) TileConfig c{};
  c.palette = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = (uint16_t)(R * 4);
  c.rows[4] = c.rows[5] = 16;
  c.colsb[4] = c.colsb[5] = 64;
  c.rows[6] = 16, c.colsb[6] = (uint16_t)(R * 4);
  // GCC 12 at -O3 drops the stores above as if ldtilecfg read only the palette: a barrier
  asm volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
}

ATTNLAB_AMX_TARGET static void amx_release() { _tile_release(); }

// The scores of 64 keys in two halves, so that a block's products run on the tile unit while
// the vector units compute the block before it (chunk_item issues block j + 1's products one by
// one during block j's P·V, AmxSteps, and collects them at j + 1): amx_issue64 leaves q_r·k_t
// of the 64 keys at kb (row stride ldk elements) in tiles 0-3 at once (an item's first block);
// qt: Q^T in DP / 32 chunks of (16, R, 2)
ATTNLAB_AMX_TARGET static void amx_issue64(const uint16_t* kb, int64_t ldk, const uint16_t* qt,
                                           int R, int DP) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const long sk = (long)ldk * 2, sq = (long)R * 4;
  for (int c = 0; c < DP; c += 32) {
    _tile_loadd(6, qt + (int64_t)c * R, sq);
    _tile_loadd(4, kb + c, sk);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, kb + 16 * ldk + c, sk);
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(4, kb + 32 * ldk + c, sk);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(5, kb + 48 * ldk + c, sk);
    _tile_dpbf16ps(3, 5, 6);
  }
}

// amx_issue64's work one product at a time, spread over the P·V loop of the block before (a
// product of 16 keys by 32 dims takes ~15 ns on this tile unit: the 8 of a D = 64 block issued
// at once held the core's reorder window and ran before the vector work, spread they run
// alongside it). begin zeroes the scores' tiles; step i loads K rows 16·(i % 4).. and dims
// 32·(i / 4).. (and Q^T's chunk at i % 4 = 0) and adds their product; rest does the steps left.
// No target attribute: GCC's tile intrinsics are asm statements, so step is inlined into the
// P·V loop (a call there made the loop save and reload its 16 accumulators, all of them
// caller-saved, around every step)
struct AmxSteps {
  const uint16_t* kb = nullptr;  // the block's first K row
  const uint16_t* qt = nullptr;  // Q^T (amx_issue64)
  int64_t ldk = 0;
  int R = 0, n = 0, i = 0;  // n = DP / 32 · 4 steps, the next one i
  void begin(const uint16_t* k, int64_t ld, const uint16_t* q, int rows, int DP) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    kb = k, ldk = ld, qt = q, R = rows, n = DP / 32 * 4, i = 0;
  }
  ATTNLAB_INLINE void step() {
    if (i >= n) return;
    const int c = i / 4 * 32, t = i % 4;
    const long sk = (long)ldk * 2;
    const uint16_t* a = kb + 16 * t * ldk + c;
    switch (t) {
      case 0:
        _tile_loadd(6, qt + (int64_t)c * R, (long)R * 4);
        _tile_loadd(4, a, sk);
        _tile_dpbf16ps(0, 4, 6);
        break;
      case 1:
        _tile_loadd(5, a, sk);
        _tile_dpbf16ps(1, 5, 6);
        break;
      case 2:
        _tile_loadd(4, a, sk);
        _tile_dpbf16ps(2, 4, 6);
        break;
      default:
        _tile_loadd(5, a, sk);
        _tile_dpbf16ps(3, 5, 6);
    }
    ++i;
  }
  void rest() {
    while (i < n) step();
  }
};

// s[r·lds + t] = q_r·k_t from tiles 0-3 (amx_issue64); cb: (64, R) floats of scratch
ATTNLAB_AMX_TARGET static void amx_collect64(int R, float* cb, float* s, int lds) {
  const long sq = (long)R * 4;
  _tile_stored(0, cb, sq);
  _tile_stored(1, cb + 16 * R, sq);
  _tile_stored(2, cb + 32 * R, sq);
  _tile_stored(3, cb + 48 * R, sq);
  asm volatile("" : : : "memory");  // cb written by the tile stores before it is read
  const __m512i step = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(R));
  for (int r = 0; r < R; ++r)  // row r's 64 scores, 16 keys a gather
    for (int t = 0; t < 64; t += 16)
      _mm512_storeu_ps(s + r * lds + t,
                       _mm512_i32gather_ps(_mm512_add_epi32(step, _mm512_set1_epi32(t * R + r)),
                                           cb, 4));
}
#endif

// s[t] = q·k_t for the W keys at kb (row stride ldk), n (NC·W, or any multiple of W for
// NC = 0) elements each: one key's sum at a time in two chains, W sums in registers
template <int NC, class T>
static inline void dot_keys_n(const float* q, const T* kb, int64_t ldk, int n, float* s) {
  const int nc = NC ? NC : n / W;
  vf acc[W];
  for (int t = 0; t < W; ++t) {
    const T* k = kb + t * ldk;
    vf a0 = vzero(), a1 = vzero();
    int c = 0;
    for (; c + 2 <= nc; c += 2) {
      a0 = vfma(vload(q + c * W), vld(k + c * W), a0);
      a1 = vfma(vload(q + c * W + W), vld(k + c * W + W), a1);
    }
    if (c < nc) a0 = vfma(vload(q + c * W), vld(k + c * W), a0);
    acc[t] = vadd(a0, a1);
  }
  vstore(s, hsum_lanes(acc));
}

template <class T>
static inline void dot_keys(const float* q, const T* kb, int64_t ldk, int n, float* s) {
  switch (W > 1 ? n / W : 0) {
    case 2: return dot_keys_n<2>(q, kb, ldk, n, s);
    case 4: return dot_keys_n<4>(q, kb, ldk, n, s);
    case 8: return dot_keys_n<8>(q, kb, ldk, n, s);
    case 16: return dot_keys_n<16>(q, kb, ldk, n, s);
    default: return dot_keys_n<0>(q, kb, ldk, n, s);
  }
}

// keys ahead of the ones summed whose K and V rows are requested: one block (with the hardware's
// stream prefetch alone, which stops at each 4 KiB page and idles while a block computes, a
// step read the cache at 60-67% of the machine's read bandwidth; a block ahead: 77-122%, two to
// eight blocks ahead measured no better, benchmarks/decode.py's shapes, 1 and 2 threads)
constexpr int PF_KEYS = KB;

// one cache line requested into L1. An asm statement: GCC 12 drops a loop of
// __builtin_prefetch here (the prefetches then never reach the code). The address is a register
// operand: as a memory operand ("m"(*p)) the asm reads memory that might be the P·V
// accumulators, so GCC kept them in memory and stored all 16 of them after every key (a bfloat16
// step in L2 13-19% slower)
static ATTNLAB_INLINE void pf(const char* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// the cache lines of n bytes at p
static ATTNLAB_INLINE void prefetch_span(const char* p, int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), first = a >> 6, last = (a + n - 1) >> 6;
  const char* line = p - (a & 63);
  for (int64_t i = 0; i <= (int64_t)(last - first); ++i) pf(line + 64 * i);
}

// The rows requested while a block is computed, one key's K and V rows per key summed, so the
// requests spread over the loop (a burst fills the core's miss buffers and stalls it; the
// hardware's stream prefetch alone stops at each 4 KiB page and idles while the block computes).
// A key costs a few instructions: the lines of a row are counted once per block, the row
// pointers advance by their stride (counting the lines a row spans at each key took 30 scalar
// instructions a key, as many as the 16 multiply-adds of 4 rows' P·V at D = 64)
struct Ahead {
  const char *k = nullptr, *v = nullptr;  // K and V rows of the first key requested of each
  int64_t ks = 0, vs = 0;                 // row strides in bytes
  int kl = 0, vl = 0;                     // lines requested a row, at 64·i
  int nk = 0, nv = 0;                     // K and V rows requested at most
#if defined(ATTNLAB_AVX512)
  AmxSteps* amx = nullptr;  // the next block's products (or none), one every `every` keys
  int every = 1, left = 1;  // left: keys to the next product
#endif
  // key t's requests, made on a copy a loop keeps in registers (its row pointers advance by
  // their strides), and with the tile unit one of the next block's products every `every` keys
  ATTNLAB_INLINE void at(int t) {
#if defined(ATTNLAB_AVX512)
    if (amx && --left == 0) {
      left = every;
      amx->step();
    }
#endif
    if (t < nk) {
      for (int i = 0; i < kl; ++i) pf(k + 64 * i);
      k += ks;
    }
    if (t < nv) {
      for (int i = 0; i < vl; ++i) pf(v + 64 * i);
      v += vs;
    }
  }
  // lines at p + 64·i that cover a row of n bytes at p, every row at p + t·stride: one per 64
  // bytes, and one more when the rows do not start on a line (the line of its last byte)
  static int lines(const char* p, int64_t stride, int64_t n) {
    const bool aligned = reinterpret_cast<uintptr_t>(p) % 64 == 0 && stride % 64 == 0;
    return (int)((n + 63) / 64) + (aligned ? 0 : 1);
  }
};

// acc[r][·] += P[r·ldp + t]·V[t·ldv + ·] for NR rows: key t's value vectors loaded once
template <int NR, int NV, class T>
static ATTNLAB_INLINE void pv_key(vf (&acc)[NR][NV], const float* P, int64_t ldp, const T* V,
                                  int64_t ldv, int t) {
  vf x[NV];
  if constexpr (std::is_same<T, bf16eo>::value)  // vectors u, u + 1: one block's even, odd
    for (int u = 0; u < NV; u += 2) vld_eo(V + t * ldv + u * W, x[u], x[u + 1]);
  else
    for (int u = 0; u < NV; ++u) x[u] = vld(V + t * ldv + u * W);
  for (int r = 0; r < NR; ++r) {
    const vf pt = vset(P[r * ldp + t]);
    for (int u = 0; u < NV; ++u) acc[r][u] = vfma(pt, x[u], acc[r][u]);
  }
}

// O[r] = O[r]·alpha[r] + Σ_{t<nt} P[r·ldp + t]·V[t·ldv + ·] for NR rows and NV vectors of
// columns at c: each V vector loaded (converted) once for all NR rows, NR·NV accumulators;
// ah (or null): key t requests the rows of its key ahead
template <int NR, int NV, class T>
static inline void pv_tile(float* O, int64_t ldo, const float* alpha, const float* P, int64_t ldp,
                           const T* V, int64_t ldv, int nt, const Ahead* ah) {
  vf acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = vmul(vload(O + r * ldo + u * W), vset(alpha[r]));
  if (ah) {  // the same loop with the requests ahead
    Ahead run = *ah;  // (the copy a loop keeps in registers)
    for (int t = 0; t < nt; ++t) {
      run.at(t);
      pv_key<NR, NV>(acc, P, ldp, V, ldv, t);
    }
  } else {
    for (int t = 0; t < nt; ++t) pv_key<NR, NV>(acc, P, ldp, V, ldv, t);
  }
  for (int r = 0; r < NR; ++r)
    for (int u = 0; u < NV; ++u) vstore(O + r * ldo + u * W, acc[r][u]);
}

template <int NR, class T>
static inline void pv_cols(float* O, int64_t ldo, const float* alpha, const float* P, int64_t ldp,
                           const T* V, int64_t ldv, int nt, int n, const Ahead* ah) {
  constexpr int NO = 4;  // NR·NO accumulators + NO values + 1 weight: within 32 (16) registers
  int c = 0;
  for (; c + NO * W <= n; c += NO * W, ah = nullptr)
    pv_tile<NR, NO>(O + c, ldo, alpha, P, ldp, V + c, ldv, nt, ah);
  if constexpr (std::is_same<T, bf16eo>::value)  // n a multiple of 2W: blocks of 2W
    for (; c < n; c += 2 * W, ah = nullptr)
      pv_tile<NR, 2>(O + c, ldo, alpha, P, ldp, V + c, ldv, nt, ah);
  else
    for (; c < n; c += W, ah = nullptr)
      pv_tile<NR, 1>(O + c, ldo, alpha, P, ldp, V + c, ldv, nt, ah);
}

// every row at once: O (R, ldo) = O·alpha + P (R, ldp) @ V (nt, ldv) over n (a multiple of W)
// columns; rows in tiles of 4, so each value row is read from the cache once for 4 rows
template <class T>
static inline void pv_rows(float* O, int64_t ldo, const float* alpha, const float* P,
                           int64_t ldp, const T* V, int64_t ldv, int nt, int R, int n,
                           const Ahead* ah) {
  int r = 0;
  for (; r + 4 <= R; r += 4, ah = nullptr)
    pv_cols<4>(O + r * ldo, ldo, alpha + r, P + r * ldp, ldp, V, ldv, nt, n, ah);
  const int left = R - r;
  O += r * ldo, alpha += r, P += r * ldp;
  if (left == 3) pv_cols<3>(O, ldo, alpha, P, ldp, V, ldv, nt, n, ah);
  if (left == 2) pv_cols<2>(O, ldo, alpha, P, ldp, V, ldv, nt, n, ah);
  if (left == 1) pv_cols<1>(O, ldo, alpha, P, ldp, V, ldv, nt, n, ah);
}

// keys [j0, j1) of one head of a cache, each row's lines at once (the start of an item)
static inline void prefetch_rows(const Rows& x, int64_t b, int64_t h, int j0, int j1) {
  const int64_t bytes = (int64_t)x.n * x.esize;
  for (int j = j0; j < j1; ++j) prefetch_span(x.row(b, h, j), bytes);
}

// One item: keys [ja, jb) of group g, its R rows; partial (O, m, l) to O/m/l (O unnormalized).
// done: the item's flag; once another thread's partial of it counts (>= 0), this one stops.
// TK, TV: the element types the blocks are read as: the cache's own, read in place (rows of
// whole vectors), or float, from the scratch rows converted and padded to whole vectors.
// bad (or null): set when a query row or a cache row read holds NaN/Inf. A key row is checked
// through its scores (q·k is not finite when k is not; a finite product that overflows is
// reported too, and then merely computed again by the caller's cleaning path), a value row
// through O (p·v with p in [0, 1] keeps a NaN/Inf in the sum)
template <class TK, class TV>
void chunk_item(const Dec& d, const Group& g, int ja, int jb, float* O, float* m, float* l,
                float* buf, std::atomic<bool>* bad, const std::atomic<int>* done) {
  const int R = d.R, DP = d.DP, DvP = d.DvP;
  float* Kb = buf;                      // (KB, DP) converted keys
  float* Vb = Kb + KB * DP;             // (KB, DvP) converted values
  float* Q = Vb + KB * DvP;             // (R, DP) queries, zero-padded
  float* Sb = Q + (int64_t)R * DP;      // (R, KB) one block's scores, then P
  float* alpha = Sb + (int64_t)R * KB;  // (R,) each row's rescale in this block
  int* rlo = reinterpret_cast<int*>(alpha + R);  // (R,) row bounds, clipped to the chunk
  int* rhi = rlo + R;
  uint16_t* Qh = reinterpret_cast<uint16_t*>(rhi + R);  // (R, DP) the queries as bfloat16
  uint16_t* Qt = Qh + (int64_t)R * DP;                   // Q^T for the tile unit (amx_scores64)
  float* Cb = reinterpret_cast<float*>(Qt + (int64_t)R * DP);  // (KB, R) its scores
  constexpr bool dp = std::is_same<TK, bf16dp>::value;
  const int h0 = g.hk * d.G + g.sub * d.GH;
  for (int r = 0; r < R; ++r) {  // r = head offset · L + row
    const int h = h0 + r / d.L, i = r % d.L;
    const int64_t qi = (((int64_t)g.b * d.H + h) * d.L + i) * d.D;  // its first element
    to_float(static_cast<const char*>(d.q) + qi * (d.qdt == F32 ? 4 : 2), d.qdt, d.D,
             Q + (int64_t)r * DP);
    std::fill(Q + (int64_t)r * DP + d.D, Q + (int64_t)(r + 1) * DP, 0.0f);
    const int bl = d.Bl > 1 ? g.b : 0, hl = d.Hl > 1 ? h : 0;
    rlo[r] = std::max(ja, d.row_lo(bl, hl, i));
    rhi[r] = std::min(jb, d.row_hi(bl, hl, i));
    m[r] = NEG_INF;
    l[r] = 0.0f;
    std::fill(O + (int64_t)r * DvP, O + (int64_t)(r + 1) * DvP, 0.0f);
    if (dp)  // exact: q was checked to be bfloat16 values (bf16_exact)
      for (int c = 0; c < DP; ++c) {
        uint32_t bits;
        std::memcpy(&bits, Q + (int64_t)r * DP + c, 4);
        Qh[(int64_t)r * DP + c] = (uint16_t)(bits >> 16);
      }
  }
  if (bad && !finite_span(Q, (int64_t)R * DP)) bad->store(true, std::memory_order_relaxed);
#if defined(ATTNLAB_AVX512)
  const bool amx = dp && d.amx && R <= 16 && KB == 64;
  if (amx) {  // Qt[c·R + 2·(16·r... ]: chunk c / 32 of 32 dims as (16 pairs, R rows, 2)
    for (int c = 0; c < DP; c += 32)
      for (int kp = 0; kp < 16; ++kp)
        for (int r = 0; r < R; ++r)
          for (int e = 0; e < 2; ++e)
            Qt[(int64_t)c * R + (kp * R + r) * 2 + e] = Qh[(int64_t)r * DP + c + 2 * kp + e];
    amx_config(R);
  }
#else
  constexpr bool amx = false;
#endif
  // in place: the cache's rows (strides in elements); else the scratch's converted rows
  const bool kd = !std::is_same<TK, float>::value || d.k_direct();
  const bool vd = !std::is_same<TV, float>::value || d.v_direct();
  vf seen = vzero();  // Σ score·0 over the scores computed: NaN when one is not finite
  // the keys of block [j0, j0 + nk) some row attends: [ba, bb) (empty: ba >= bb)
  auto attended = [&](int j0, int nk, int& ba, int& bb) {
    ba = j0 + nk, bb = j0;
    for (int r = 0; r < R; ++r)
      if (rlo[r] < rhi[r] && rlo[r] < j0 + nk && rhi[r] > j0) {
        ba = std::min(ba, std::max(rlo[r], j0));
        bb = std::max(bb, std::min(rhi[r], j0 + nk));
      }
  };
  // the tile unit scores block [j0, j0 + KB) for every row: a whole block some row attends
  // throughout (its rows read in place, kd)
  auto tiled = [&](int j0) {
    if (!amx || j0 + KB > jb) return false;
    int a, b;
    attended(j0, KB, a, b);
    return a == j0 && b == j0 + KB;
  };
  // the first blocks' K rows requested at once; the tile unit scores block j + 1 while block j
  // is computed, so its K rows are requested two blocks ahead
  const int k_ahead = amx ? 2 * PF_KEYS : PF_KEYS;
  prefetch_rows(d.k, g.b, g.hk, ja, std::min(jb, ja + k_ahead));
  prefetch_rows(d.v, g.b, g.hk, ja, std::min(jb, ja + PF_KEYS));
  bool issued = false;  // tiles 0-3 hold the scores of block j0, issued during the block before
#if defined(ATTNLAB_AVX512)
  AmxSteps next;  // their products, one at a time in the P·V loop
#endif
  for (int j0 = ja; j0 < jb; j0 += KB) {
    if (done && done->load(std::memory_order_relaxed) >= 0) break;  // another thread's counts
    const int nk = std::min(KB, jb - j0);
    int ba, bb;
    attended(j0, nk, ba, bb);
    if (ba >= bb) continue;
    const TK* kb = reinterpret_cast<const TK*>(Kb);  // key j at kb + (j - j0)·ldk
    int64_t ldk = DP;
    if (kd) {
      kb = reinterpret_cast<const TK*>(d.k.row(g.b, g.hk, j0));
      ldk = d.k.ss;
    } else {
      for (int j = ba; j < bb; ++j) {
        float* o = Kb + (int64_t)(j - j0) * DP;
        to_float(d.k.row(g.b, g.hk, j), d.k.dt, d.D, o);
        std::fill(o + d.D, o + DP, 0.0f);
      }
    }
    int amx_end = ba;  // keys [ba, amx_end) scored for every row by the tile unit
#if defined(ATTNLAB_AVX512)
    if (issued || tiled(j0)) {
      if (!issued) amx_issue64(reinterpret_cast<const uint16_t*>(kb), ldk, Qt, R, DP);
      amx_collect64(R, Cb, Sb, KB);
      amx_end = bb;
    }
    issued = tiled(j0 + KB);  // the next block's products, during this one's P·V
    if (issued)
      next.begin(reinterpret_cast<const uint16_t*>(d.k.row(g.b, g.hk, j0 + KB)), d.k.ss, Qt, R,
                 DP);
#endif
    // every row that sees a key of the block: scores, then its online softmax step; P (R, KB)
    // holds each row's weights over the block's attended keys [ba, bb), 0 outside its own
    const int pa = (ba - j0) / W, pz = (bb - j0 + W - 1) / W;  // P's vectors
    for (int r = 0; r < R; ++r) {
      const int lo = std::max(rlo[r], j0), hi = std::min(rhi[r], j0 + nk);
      float* s = Sb + (int64_t)r * KB;
      alpha[r] = 1.0f;
      if (lo >= hi) {
        for (int t = pa; t < pz; ++t) vstore(s + t * W, vzero());
        continue;
      }
      const float* qr = Q + (int64_t)r * DP;
      int j = std::max(lo, amx_end);
#if defined(ATTNLAB_AVX512)
      if constexpr (dp) {
        const uint16_t* kq = reinterpret_cast<const uint16_t*>(kb);
        for (; j < hi; j += 16)
          dot_keys_dp(Qh + (int64_t)r * DP, kq + (j - j0) * ldk, ldk, DP, s + (j - j0),
                      std::min(16, hi - j));
      }
#endif
      for (; j + W <= hi; j += W) dot_keys(qr, kb + (j - j0) * ldk, ldk, DP, s + (j - j0));
      for (; j < hi; ++j) s[j - j0] = dot(qr, kb + (j - j0) * ldk, DP);
      const int h = h0 + r / d.L, i = r % d.L;
      const RowMods md{d.softcap, d.softcap > 0 ? 1.0f / d.softcap : 0.0f,
                       d.slopes ? d.slopes[g.b * d.slope_sb + h] : 0.0f, d.slopes != nullptr,
                       d.pos_off - i, d.scale};
      vf mx = vset(NEG_INF);
      const int va = (lo - j0) / W, vb = (hi - j0 + W - 1) / W;
      for (int t = pa; t < va; ++t) vstore(s + t * W, vzero());
      for (int t = vb; t < pz; ++t) vstore(s + t * W, vzero());
      for (int t = va; t < vb; ++t) {  // edge lanes outside [lo, hi) -> -inf
        const int jv = j0 + t * W;
        const vf raw = vload(s + t * W);
        vf x;
        if (jv >= lo && jv + W <= hi) {  // a whole vector of the row's keys
          seen = vfma(raw, vzero(), seen);
          x = modify(raw, md, jv, nullptr);
        } else {
          seen = vfma(vmask(raw, jv, lo, hi, 0.0f), vzero(), seen);
          x = vmask(modify(raw, md, jv, nullptr), jv, lo, hi);
        }
        vstore(s + t * W, x);
        mx = vmax(mx, x);
      }
      const float mo = m[r], mn = std::max(mo, hmax(mx));
      if (mn == NEG_INF) {  // every score -inf (an infinite product): nothing to add
        for (int t = va; t < vb; ++t) vstore(s + t * W, vzero());
        continue;
      }
      // (the max mostly holds after the first blocks: exp(0) = 1 exactly, without libm's call;
      // expf was 2.5% of a 4k-key bfloat16 step's samples)
      const float a = mo == NEG_INF ? 0.0f : mo == mn ? 1.0f : std::exp(mo - mn);
      vf sum = vzero();
      for (int t = va; t < vb; ++t) {
        const vf p = vexp(vsub(vload(s + t * W), vset(mn)));
        vstore(s + t * W, p);
        sum = vadd(sum, p);
      }
      l[r] = l[r] * a + hsum(sum);
      m[r] = mn;
      alpha[r] = a;
    }
    const TV* vb = reinterpret_cast<const TV*>(Vb);  // value j at vb + (j - j0)·ldv
    int64_t ldv = DvP;
    if (vd) {
      vb = reinterpret_cast<const TV*>(d.v.row(g.b, g.hk, j0));
      ldv = d.v.ss;
    } else {
      for (int j = ba; j < bb; ++j) {
        float* o = Vb + (int64_t)(j - j0) * DvP;
        to_float(d.v.row(g.b, g.hk, j), d.v.dt, d.Dv, o);
        std::fill(o + d.Dv, o + DvP, 0.0f);
      }
    }
    // O = O·a + P[ba..bb) @ V[ba..bb)   (R, n) @ (n, Dv): a row's zero weights outside its keys
    // add nothing (0·v = 0 for the finite values of a call that passed its check or was cleaned)
    Ahead ah;  // the V rows PF_KEYS ahead of the ones summed here, the K rows k_ahead
    const int fk = ba + k_ahead, fv = ba + PF_KEYS;
    if (fv < jb) {
      ah.k = d.k.row(g.b, g.hk, std::min(fk, jb - 1)), ah.v = d.v.row(g.b, g.hk, fv);
      ah.ks = d.k.ss * d.k.esize, ah.vs = d.v.ss * d.v.esize;
      ah.kl = Ahead::lines(ah.k, ah.ks, (int64_t)d.k.n * d.k.esize);
      ah.vl = Ahead::lines(ah.v, ah.vs, (int64_t)d.v.n * d.v.esize);
      ah.nk = std::max(0, jb - fk), ah.nv = jb - fv;
    }
#if defined(ATTNLAB_AVX512)
    if (issued && ah.nv > 0) {
      ah.amx = &next;
      ah.every = ah.left = std::max(1, (bb - ba) / next.n);
    }
#endif
    pv_rows(O, DvP, alpha, Sb + (ba - j0), KB, vb + (ba - j0) * ldv, ldv, bb - ba, R, DvP,
            ah.nv > 0 ? &ah : nullptr);
#if defined(ATTNLAB_AVX512)
    if (issued) next.rest();  // the products the loop left (or all: no rows ahead, or P·V none)
#endif
  }
  if (bad && (hsum(seen) != 0.0f || !finite_span(O, (int64_t)R * DvP)))
    bad->store(true, std::memory_order_relaxed);
#if defined(ATTNLAB_AVX512)
  if (amx) amx_release();  // the tile state back to its init: cheaper to switch threads
#endif
}

using ItemFn = void (*)(const Dec&, const Group&, int, int, float*, float*, float*, float*,
                        std::atomic<bool>*, const std::atomic<int>*);

// values: read in place as stored (every row tile of 4 converts a value vector once in registers)
// when Dv is whole vectors; else converted into the scratch's padded float rows
template <class TK>
ItemFn item_for_v(const Dec& d) {
  if (d.v_eo) return &chunk_item<TK, bf16eo>;
  if (d.Dv % W || d.v.dt == F32) return &chunk_item<TK, float>;
  return d.v.dt == BF16 ? &chunk_item<TK, bf16> : &chunk_item<TK, f16>;
}

// whether every q value is a bfloat16 value (a bfloat16 q, or float32 whose low 16 bits are
// zero): the products of vdpbf16ps are then exact, as in float32
bool bf16_exact(const void* qv, int qdt, int64_t n) {
  if (qdt != F32) return qdt == BF16;
  const float* q = static_cast<const float*>(qv);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, q + i, 4);
    if (bits & 0xffff) return false;
  }
  return true;
}

bool cpu_has_bf16() {
#if defined(ATTNLAB_AVX512) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

// keys: bfloat16 keys by AVX-512 BF16 where the CPU has it and q is bfloat16; else read in place
// for one row, converted once into the scratch for several
ItemFn item_fn(const Dec& d, int64_t qn) {
  if (d.k.dt == BF16 && d.D % 32 == 0 && W == 16 && cpu_has_bf16() && bf16_exact(d.q, d.qdt, qn))
    return item_for_v<bf16dp>(d);
  if (d.D % W || d.R > 1 || d.k.dt == F32) return item_for_v<float>(d);
  return d.k.dt == BF16 ? item_for_v<bf16>(d) : item_for_v<f16>(d);
}

// the rows of one group from its chunks' partials (or its one chunk), normalized into out/lse
void finish_group(const Dec& d, const Group& g, const float* const* parts, float* out,
                  float* lse) {
  const int R = d.R, DvP = d.DvP, n = g.nch;
  const int h0 = g.hk * d.G + g.sub * d.GH;
  for (int r = 0; r < R; ++r) {
    const int h = h0 + r / d.L, i = r % d.L;
    const int64_t row = ((int64_t)g.b * d.H + h) * d.L + i;
    float* o = out + row * d.Dv;
    float M = NEG_INF;
    for (int c = 0; c < n; ++c) M = std::max(M, parts[c][(int64_t)R * DvP + r]);
    float sum = 0.0f;
    std::fill(o, o + d.Dv, 0.0f);
    if (M != NEG_INF)
      for (int c = 0; c < n; ++c) {
        const float* pc = parts[c];
        const float mc = pc[(int64_t)R * DvP + r], lc = pc[(int64_t)R * DvP + R + r];
        if (mc == NEG_INF) continue;
        const float w = mc == M ? 1.0f : std::exp(mc - M);  // (exp(0) = 1 exactly)
        sum += lc * w;
        const float* oc = pc + (int64_t)r * DvP;
        if (d.v_eo)
          for (int e = 0; e < d.Dv; ++e) o[e] += w * oc[o_col(d, e)];
        else
          for (int e = 0; e < d.Dv; ++e) o[e] += w * oc[e];
      }
    if (sum > 0.0f) {
      const float inv = 1.0f / sum;
      for (int e = 0; e < d.Dv; ++e) o[e] *= inv;
      lse[row] = M + std::log(sum);
    } else {
      std::fill(o, o + d.Dv, 0.0f);
      lse[row] = NEG_INF;
    }
  }
}

// One call's items, shared with helper threads that may still run after the call returned:
// they then hold the tensors they read (hold), and what they compute is dropped
// The tensors of calls whose Shared a helper thread let go of last: a helper may still read the
// cache after its call returned, so the call's Shared holds q, k and v until every helper is done
// with it, but a tensor's last reference must not drop on one of PyTorch's pool threads: where
// Python holds the tensor too, its release takes the GIL, and a pool thread that asks for the GIL
// while the interpreter exits is ended by Python (pthread_exit unwinding through the pool's
// noexcept frames: std::terminate, an abort at exit). They wait here for the next call's calling
// thread (`release_late`); the list is never destroyed, so what a process's last call left is
// left to the OS at exit.
std::mutex& late_mu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::vector<Tensor>& late() {
  static std::vector<Tensor>* held = new std::vector<Tensor>();
  return *held;
}

// drops the tensors helpers left, on this (calling) thread
void release_late() {
  std::vector<Tensor> old;
  std::lock_guard<std::mutex> g(late_mu());
  old.swap(late());
}  // (old's tensors released here, after the lock: a Python release may take a while)

struct Shared {
  // its tensors go to `late` when the last owner is a helper, not the calling thread
  ~Shared() {
    if (std::this_thread::get_id() == caller) return;
    std::lock_guard<std::mutex> g(late_mu());
    for (Tensor& t : hold) late().push_back(std::move(t));
  }
  std::thread::id caller = std::this_thread::get_id();
  int cpu = caller_cpu();  // the caller's CPU when its call began, which helpers keep off
  Dec d;
  std::vector<Group> groups;
  std::vector<int64_t> owner;  // item -> its group
  int64_t chunk = 0, n = 0, each = 0;  // each: floats of one partial, O (R, DvP), m (R,), l (R,)
  size_t scratch = 0;
  ItemFn fn = nullptr;
  bool check = false;
  std::vector<Tensor> hold;  // q, k, v, lo, hi, slopes
  std::atomic<int64_t> next{0};
  std::unique_ptr<std::atomic<int>[]> done_by;  // per item: -1, or the thread whose partial counts
  std::vector<std::vector<float>> result;        // per thread: its partial of every item it ran
  std::atomic<bool> bad{false};
};

// item by thread t into its own partial, which counts unless another thread's already does
void run_one(Shared& s, int t, int64_t item, float* buf) {
  const Group& g = s.groups[s.owner[item]];
  const int c = (int)(item - g.first_item), R = s.d.R;
  const int ja = g.klo + c * (int)s.chunk, jb = std::min(g.khi, ja + (int)s.chunk);
  const int64_t ro = (int64_t)R * s.d.DvP;
  float* pc = s.result[t].data() + item * s.each;
  if (ja < jb)
    s.fn(s.d, g, ja, jb, pc, pc + ro, pc + ro + R, buf, s.check ? &s.bad : nullptr,
         &s.done_by[item]);
  else  // a group no row of which attends anything
    for (int r = 0; r < R; ++r) pc[ro + r] = NEG_INF;
  int none = -1;  // acq_rel: the caller that reads this partial sees it whole
  s.done_by[item].compare_exchange_strong(none, t, std::memory_order_acq_rel);
}

// thread t's share: the next item no thread has claimed, until none is left; then, for a
// helper, the items claimed and not finished yet, last to first (the caller, which computes
// them first to last after the queue, may be the thread the OS holds off the core on a busy
// machine); a helper started after every item finished does nothing
void pull(Shared& s, int t) {
  std::vector<float> buf;
  std::optional<OffCpu> away;  // a helper with an item: off the caller's CPU (OffCpu)
  auto run = [&](int64_t i) {
    if (t > 0 && !away) away.emplace(s.cpu);
    if (buf.empty()) buf.resize(s.scratch + 16);  // once this thread has an item
    if (s.result[t].empty()) s.result[t].assign(s.n * s.each, 0.0f);  // its partials
    run_one(s, t, i, buf.data());
  };
  for (int64_t i; (i = s.next.fetch_add(1)) < s.n;) run(i);
  if (t > 0)
    for (int64_t i = s.n - 1; i >= 0; --i)
      if (s.done_by[i].load(std::memory_order_acquire) < 0) run(i);
}

// Every item on the calling thread and its helpers, then the groups merged by the caller. The
// caller never waits for a helper: an item a helper claimed and has not finished (the OS holds
// the helper off the core, as on a machine busy with other work, where waiting for one took a
// 2-thread step to 3x the time of one thread) is computed by the caller too, and the first
// partial done counts (every thread computes an item alike); the other stops at its next block,
// so a helper the OS resumes after the call has returned soon leaves the cores
void run_shared(const std::shared_ptr<Shared>& sp, int64_t T, float* out, float* lse) {
  Shared& s = *sp;
  s.result.resize(T);
  s.result[0].assign(s.n * s.each, 0.0f);  // the caller's partials (it recomputes into them)
  for (int64_t t = 1; t < T; ++t) Helpers::post([sp, t] { pull(*sp, (int)t); }, (int)T - 1);
  pull(s, 0);
  std::vector<float> buf(s.scratch + 16);
  for (int64_t i = 0; i < s.n; ++i)
    if (s.done_by[i].load(std::memory_order_acquire) < 0) run_one(s, 0, i, buf.data());
  std::vector<const float*> parts;
  for (const Group& g : s.groups) {
    parts.clear();
    for (int c = 0; c < g.nch; ++c) {
      const int64_t item = g.first_item + c;
      parts.push_back(s.result[s.done_by[item].load(std::memory_order_acquire)].data() +
                      item * s.each);
    }
    finish_group(s.d, g, parts.data(), out, lse);
  }
}

// n floats into q's 16-bit dtype, bit for bit as Tensor.to gives them on this CPU (PyTorch's
// vectorized conversions), so that a call's out costs no op of its own: bfloat16 rounded to
// nearest even, a NaN as 0xffff; float16 by vcvtps2ph (nearest even; a NaN kept quiet with its
// sign and top mantissa bits), by the same rule in integer arithmetic where the build has no F16C
static void floats_to(const float* src, int dt, int64_t n, uint16_t* dst) {
  if (dt == BF16) {
    for (int64_t i = 0; i < n; ++i) {  // (vectorized by the compiler)
      uint32_t u;
      std::memcpy(&u, src + i, 4);
      const uint16_t r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      dst[i] = src[i] != src[i] ? (uint16_t)0xffff : r;
    }
    return;
  }
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
#else
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t h;
    if (a > 0x7f800000u) {  // NaN: quiet, its top mantissa bits
      h = 0x7e00u | ((a >> 13) & 0x3ffu);
    } else if (a >= 0x477ff000u) {  // rounds to >= 65520: inf
      h = 0x7c00u;
    } else if (a >= 0x38800000u) {  // normal: rebias, round to nearest even
      const uint32_t m = a - 0x38000000u;
      h = (m + 0xfffu + ((m >> 13) & 1u)) >> 13;
    } else {  // subnormal or zero: the value in units of 2^-24, nearest even
      const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
      const int sh = 126 - (int)e;  // 2^-24 units: mant · 2^(e - 150) / 2^-24
      if (sh > 24) {
        h = 0;
      } else {
        const uint32_t q = mant >> sh, rem = mant & ((1u << sh) - 1), half = 1u << (sh - 1);
        h = q + (rem > half || (rem == half && (q & 1u)));
      }
    }
    dst[i] = (uint16_t)(sign | h);
  }
#endif
}

int dtype_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return F32;
    case at::kBFloat16: return BF16;
    case at::kHalf: return F16;
    default: TORCH_CHECK(false, name, ": expected float32, bfloat16 or float16, got ",
                         t.scalar_type());
  }
  return F32;
}

Rows rows_of(const Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4 && t.device().is_cpu() && (t.size(3) <= 1 || t.stride(3) == 1), name,
              ": expected a 4-d CPU tensor with unit stride along its last dim, got sizes ",
              t.sizes(), " strides ", t.strides());
  return Rows{static_cast<const char*>(t.data_ptr()), dtype_of(t, name), (int)t.element_size(),
              (int)t.size(3), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace

int64_t decode_bf16_path() { return cpu_has_bf16() ? 2 : W > 1 ? 1 : 0; }

std::tuple<Tensor, Tensor, bool> decode(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const std::optional<Tensor>& lo_,
                                        const std::optional<Tensor>& hi_,
                                        const std::optional<Tensor>& slopes, double scale,
                                        double softcap, int64_t pos_off, int64_t chunk,
                                        bool check) {
  release_late();
  TORCH_CHECK(q.dim() == 4 && q.is_contiguous() && q.device().is_cpu(),
              "q: expected a contiguous (B, H, L, D) CPU tensor");
  Dec d{};
  d.qdt = dtype_of(q, "q");
  d.B = q.size(0);
  d.H = q.size(1);
  d.L = q.size(2);
  d.D = q.size(3);
  d.k = rows_of(k, "k");
  d.v = rows_of(v, "v");
  d.Hkv = k.size(1);
  d.S = k.size(2);
  d.Dv = v.size(3);
  TORCH_CHECK(k.size(0) == d.B && k.size(3) == d.D && d.Hkv > 0 && d.H % d.Hkv == 0,
              "k: expected (B, Hkv, S, D) with H a multiple of Hkv, got ", k.sizes());
  TORCH_CHECK(v.size(0) == d.B && v.size(1) == d.Hkv && v.size(2) == d.S,
              "v: expected (B, Hkv, S, Dv), got ", v.sizes());
  TORCH_CHECK(lo_.has_value() == hi_.has_value(), "lo, hi: expected both or neither");
  d.Bl = d.Hl = 1;  // without lo and hi: one interval [0, S) for every row
  if (lo_.has_value()) {
    const Tensor &lo = *lo_, &hi = *hi_;
    TORCH_CHECK(lo.dim() == 3 && hi.sizes() == lo.sizes() && lo.is_contiguous() &&
                    hi.is_contiguous() && lo.scalar_type() == at::kInt &&
                    hi.scalar_type() == at::kInt && (lo.size(0) == 1 || lo.size(0) == d.B) &&
                    (lo.size(1) == 1 || lo.size(1) == d.H) && lo.size(2) == d.L,
                "lo, hi: expected contiguous int32 (B|1, H|1, L), got ", lo.sizes());
    d.Bl = lo.size(0);
    d.Hl = lo.size(1);
    d.lo_sb = d.Bl > 1 ? lo.stride(0) : 0;
    d.lo_sh = d.Hl > 1 ? lo.stride(1) : 0;
    d.lo = lo.data_ptr<int32_t>();
    d.hi = hi.data_ptr<int32_t>();
  }
  if (slopes.has_value()) {
    const Tensor& s = *slopes;
    TORCH_CHECK(s.dim() == 2 && s.is_contiguous() && s.scalar_type() == at::kFloat &&
                    (s.size(0) == 1 || s.size(0) == d.B) && s.size(1) == d.H,
                "slopes: expected float32 (B|1, H), got ", s.sizes());
    d.slopes = s.data_ptr<float>();
    d.slope_sb = s.size(0) > 1 ? s.stride(0) : 0;
  }
  d.scale = (float)scale;
  d.softcap = (float)softcap;
  d.pos_off = (int)pos_off;
#if defined(ATTNLAB_AVX512)
  const char* amx_env = std::getenv("ATTNLAB_DECODE_AMX");
  d.amx = !(amx_env && std::string(amx_env) == "0") && amx_ok();
#endif
  d.DP = (d.D + W - 1) / W * W;
  d.DvP = (d.Dv + W - 1) / W * W;
  d.v_eo = W > 1 && d.v.dt == BF16 && d.Dv % (2 * W) == 0;  // (values read in place)
  d.q = q.data_ptr();
  d.G = d.H / d.Hkv;
  // heads per item: all G of a kv head while their rows fit RMAX; else the largest divisor of G
  d.GH = d.G;
  while (d.GH > 1 && d.GH * d.L > RMAX) {
    int g = d.GH - 1;
    while (d.G % g) --g;
    d.GH = g;
  }
  d.nsub = d.G / d.GH;
  d.R = d.GH * d.L;

  const auto f32 = q.options().dtype(at::kFloat);
  Tensor out = at::empty({d.B, d.H, d.L, d.Dv}, q.options());  // (B, H, L, Dv) in q's dtype
  Tensor lse = at::empty({d.B, d.H, d.L}, f32);                // (B, H, L)
  std::vector<float> out16;  // a 16-bit q's out as floats, converted at the end (floats_to)
  if (d.qdt != F32) out16.resize(out.numel());
  float* po = d.qdt == F32 ? out.data_ptr<float>() : out16.data();
  float* pl = lse.data_ptr<float>();
  if (d.B == 0 || d.H == 0 || d.L == 0) return {out, lse, check};

  // groups and their keys: the union of their rows' intervals, in chunks of `chunk` keys
  std::vector<Group> groups;
  double bytes = 0;  // cache bytes the call reads
  const int64_t row_bytes = (int64_t)d.D * d.k.esize + (int64_t)d.Dv * d.v.esize;
  for (int b = 0; b < d.B; ++b)
    for (int hk = 0; hk < d.Hkv; ++hk)
      for (int sub = 0; sub < d.nsub; ++sub) {
        Group g{b, hk, sub, d.S, 0, 0, 0};
        const int h0 = hk * d.G + sub * d.GH;
        for (int h = h0; h < h0 + d.GH; ++h)
          for (int i = 0; i < d.L; ++i) {
            const int bl = d.Bl > 1 ? b : 0, hl = d.Hl > 1 ? h : 0;
            const int a = d.row_lo(bl, hl, i), e = d.row_hi(bl, hl, i);
            TORCH_CHECK(a >= e || (a >= 0 && e <= d.S), "lo, hi: row ", i, "'s keys [", a, ", ",
                        e, ") outside [0, ", d.S, ")");
            if (a < e) {
              g.klo = std::min(g.klo, a);
              g.khi = std::max(g.khi, e);
            }
          }
        if (g.klo >= g.khi) g.klo = g.khi = 0;
        bytes += (double)(g.khi - g.klo) * row_bytes;
        groups.push_back(g);
      }
  // chunk <= 0: chosen here, a whole number of blocks, so that there are several items per
  // thread (a thread the OS preempts then holds up little) yet each reads >= 256 KiB
  const int64_t T = at::get_num_threads();
  if (chunk <= 0) {
    double keys = 0;
    for (const Group& g : groups) keys += g.khi - g.klo;
    const double want = std::max<double>((double)groups.size(), T > 1 ? 8.0 * T : 1.0);
    const double min_keys = std::max<double>(KB, 256.0 * 1024 / std::max<int64_t>(row_bytes, 1));
    chunk = (int64_t)std::max(min_keys, std::ceil(keys / want));
  }
  chunk = std::max<int64_t>(KB, (chunk + KB - 1) / KB * KB);
  auto sp = std::make_shared<Shared>();
  Shared& sh = *sp;
  int64_t items = 0;
  for (Group& g : groups) {
    g.nch = std::max<int>(1, (int)((g.khi - g.klo + chunk - 1) / chunk));
    g.first_item = items;
    items += g.nch;
  }
  sh.owner.resize(items);
  for (size_t i = 0; i < groups.size(); ++i)
    for (int c = 0; c < groups[i].nch; ++c) sh.owner[groups[i].first_item + c] = (int64_t)i;
  sh.d = d;
  sh.groups = std::move(groups);
  sh.chunk = chunk;
  sh.n = items;
  sh.each = (int64_t)d.R * (d.DvP + 2);
  sh.scratch = scratch_floats(d);
  sh.fn = item_fn(d, q.numel());
  sh.check = check;
  sh.hold = {q, k, v};
  if (lo_.has_value()) sh.hold.insert(sh.hold.end(), {*lo_, *hi_});
  if (slopes.has_value()) sh.hold.push_back(*slopes);
  sh.done_by.reset(new std::atomic<int>[items]);
  for (int64_t i = 0; i < items; ++i) sh.done_by[i].store(-1);
  // helpers: as run_items counts them (one per HELPER_NS of work, at most the threads)
  const int64_t helpers = std::min<int64_t>(
      {T, items, 1 + (int64_t)std::min(stream_ns(bytes / 4) / HELPER_NS, 1e9)});
  run_shared(sp, helpers, po, pl);
  if (d.qdt != F32)
    floats_to(po, d.qdt, out.numel(), static_cast<uint16_t*>(out.data_ptr()));
  const bool bad = sh.bad.load();
  return {out, lse, check && !bad};
}

}  // namespace attnlab_k
