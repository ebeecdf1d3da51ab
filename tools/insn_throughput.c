/* The clock and the throughput of the vector instructions docs/benchmarks.md reasons with ("What bounds the CPU
 * step", "CPU loop choices": the divider, blends, permutes): each instruction in independent copies, so that only
 * its port or unit limits it; two groups show what shares the divider (the square root, or permutes). Then the 8-bit decode's two ways of
 * reading a 256-entry float table for eight code bytes: one gather, or eight scalar loads joined by shuffles; and
 * where the CPU has AVX-512 VBMI, the same for 64 codes: four 16-lane gathers, 64 scalar loads, or the table's four
 * byte planes read by byte permutes and interleaved into floats (no gather). x86-64 with AVX2; the zmm rows run
 * where the CPU has AVX-512. No PMU needed.
 *
 *     gcc -O2 -o build/insn_throughput tools/insn_throughput.c && taskset -c 1 build/insn_throughput
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { kRounds = 20000000 };

/* A loop of 8 copies of the body (each `per` instructions) for kRounds rounds, its operands broadcast to the
 * registers `reg`0 and `reg`1 first; cycles per instruction. */
#define TIME_WITH(reg, name, per, body)                                                                    \
  do {                                                                                                     \
    long n = kRounds;                                                                                      \
    const double t0 = now();                                                                               \
    __asm__ volatile("vbroadcastss (%1), %%" reg "0\n vbroadcastss 4(%1), %%" reg "1\n"                  \
                     "1:\n" body body body body body body body body "dec %0\n jnz 1b"                     \
                     : "+r"(n) : "r"(operands) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "memory");        \
    printf("%-14s %5.2f cycles\n", name, (now() - t0) * ghz * 1e9 / (kRounds * 8.0 * (per)));             \
  } while (0)
#define TIME(name, per, body) TIME_WITH("ymm", name, per, body)
#define TIME512(name, per, body) TIME_WITH("zmm", name, per, body)

static float table[256];
static uint8_t codes[1 << 16];

/* table[code] for 8 codes a round, summed: by one gather of the widened codes. */
__attribute__((target("avx2"), noinline)) static float by_gather(long rounds) {
  __m256 sum = _mm256_setzero_ps();
  for (long k = 0; k < rounds; ++k) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i*)(codes + ((k * 8) & 0xfff8)));
    sum = _mm256_add_ps(sum, _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(bytes), 4));
  }
  return _mm256_cvtss_f32(sum);
}

/* The same by eight scalar loads, each code byte read from memory, joined by shuffles (the AVX2 8-bit decode). */
__attribute__((target("avx2"), noinline)) static float by_loads(long rounds) {
  __m256 sum = _mm256_setzero_ps();
  for (long k = 0; k < rounds; ++k) {
    const uint8_t* c = codes + ((k * 8) & 0xfff8);
    const __m128 a = _mm_unpacklo_ps(_mm_load_ss(table + c[0]), _mm_load_ss(table + c[1]));
    const __m128 b = _mm_unpacklo_ps(_mm_load_ss(table + c[2]), _mm_load_ss(table + c[3]));
    const __m128 d = _mm_unpacklo_ps(_mm_load_ss(table + c[4]), _mm_load_ss(table + c[5]));
    const __m128 e = _mm_unpacklo_ps(_mm_load_ss(table + c[6]), _mm_load_ss(table + c[7]));
    const __m256 v = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_movelh_ps(a, b)), _mm_movelh_ps(d, e), 1);
    sum = _mm256_add_ps(sum, v);
  }
  return _mm256_cvtss_f32(sum);
}

#define VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi"), noinline))
static uint8_t planes[4][256] __attribute__((aligned(64)));  /* byte p of every table entry */

/* table[code] for 64 codes a round, by four 16-lane gathers; four sums, so that no add chain limits it. */
VBMI static float by_gather512(long rounds) {
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (long k = 0; k < rounds; ++k)
    for (int j = 0; j < 4; ++j) {
      const __m128i bytes = _mm_loadu_si128((const __m128i*)(codes + ((k * 64 + j * 16) & 0xfff0)));
      sum[j] = _mm512_add_ps(sum[j], _mm512_i32gather_ps(_mm512_cvtepu8_epi32(bytes), table, 4));
    }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3])));
}

/* The same by sixteen scalar loads a vector, joined by shuffles, as the AVX2 decode does with eight. */
VBMI static float by_loads512(long rounds) {
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (long k = 0; k < rounds; ++k)
    for (int j = 0; j < 4; ++j) {
      const uint8_t* c = codes + ((k * 64 + j * 16) & 0xfff0);
      __m128 q[4];
      for (int i = 0; i < 4; ++i, c += 4)
        q[i] = _mm_movelh_ps(_mm_unpacklo_ps(_mm_load_ss(table + c[0]), _mm_load_ss(table + c[1])),
                             _mm_unpacklo_ps(_mm_load_ss(table + c[2]), _mm_load_ss(table + c[3])));
      const __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(q[0]), q[1], 1);
      const __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(q[2]), q[3], 1);
      const __m512 v = _mm512_castpd_ps(
          _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
      sum[j] = _mm512_add_ps(sum[j], v);
    }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3])));
}

/* The same by byte planes: per plane two 128-entry byte permutes and a blend on the code's top bit, then two
 * rounds of unpacks build the floats. Unpacks work within 128-bit lanes, so the codes are permuted first to
 * leave element 16 j + i in lane i of sum[j]. */
VBMI static float by_planes(long rounds) {
  uint8_t order[64];
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 4; ++j)
      for (int q = 0; q < 4; ++q) order[16 * lane + 4 * j + q] = (uint8_t)(16 * j + 4 * lane + q);
  const __m512i perm = _mm512_loadu_si512(order);
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (long k = 0; k < rounds; ++k) {
    const __m512i idx = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(codes + ((k * 64) & 0xffc0)));
    const __mmask64 high = _mm512_movepi8_mask(idx);
    __m512i b[4];
    for (int p = 0; p < 4; ++p) {
      const __m512i* t = (const __m512i*)planes[p];
      b[p] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t[0], idx, t[1]),
                                    _mm512_permutex2var_epi8(t[2], idx, t[3]));
    }
    const __m512i lo = _mm512_unpacklo_epi8(b[0], b[1]), hi = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i lo2 = _mm512_unpacklo_epi8(b[2], b[3]), hi2 = _mm512_unpackhi_epi8(b[2], b[3]);
    sum[0] = _mm512_add_ps(sum[0], _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo, lo2)));
    sum[1] = _mm512_add_ps(sum[1], _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo, lo2)));
    sum[2] = _mm512_add_ps(sum[2], _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi, hi2)));
    sum[3] = _mm512_add_ps(sum[3], _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi, hi2)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3])));
}

int main(void) {
  static const float operands[2] = {1.7f, 3.1f};  /* normal values: no special case in the divider */
  /* a dependent chain of imul (latency 3 cycles on every recent x86) gives the clock */
  long n = 100000000, x = 3;
  const double t0 = now();
  __asm__ volatile("1: imul %0, %0\n imul %0, %0\n imul %0, %0\n dec %1\n jnz 1b" : "+r"(x), "+r"(n));
  const double ghz = 9.0 * 100000000 / (now() - t0) / 1e9;
  printf("clock          %5.2f GHz\n", ghz);
  TIME("vdivps ymm", 1, "vdivps %%ymm1, %%ymm0, %%ymm2\n");
  TIME("vsqrtps ymm", 1, "vsqrtps %%ymm1, %%ymm2\n");
  /* one divider takes both: a division and a square root cost the sum of their times, permutes run beside them */
  TIME("div+sqrt pair", 1, "vdivps %%ymm1, %%ymm0, %%ymm2\n vsqrtps %%ymm1, %%ymm3\n");
  TIME("div+2 vpermps", 1, "vdivps %%ymm1, %%ymm0, %%ymm2\n vpermps %%ymm1, %%ymm0, %%ymm3\n vpermps %%ymm0, %%ymm1, %%ymm4\n");
  if (__builtin_cpu_supports("avx512f")) {
    TIME512("vdivps zmm", 1, "vdivps %%zmm1, %%zmm0, %%zmm2\n");
    TIME512("vsqrtps zmm", 1, "vsqrtps %%zmm1, %%zmm2\n");
  }
  TIME("vblendvps ymm", 3,
       "vblendvps %%ymm1, %%ymm0, %%ymm1, %%ymm2\n vblendvps %%ymm0, %%ymm1, %%ymm0, %%ymm3\n"
       " vblendvps %%ymm1, %%ymm0, %%ymm1, %%ymm4\n");
  TIME("vpermps ymm", 3,
       "vpermps %%ymm1, %%ymm0, %%ymm2\n vpermps %%ymm0, %%ymm1, %%ymm3\n vpermps %%ymm1, %%ymm0, %%ymm4\n");
  TIME("vpaddd ymm", 3, "vpaddd %%ymm1, %%ymm0, %%ymm2\n vpaddd %%ymm0, %%ymm1, %%ymm3\n vpaddd %%ymm1, %%ymm0, %%ymm4\n");
  TIME("vmulps ymm", 3, "vmulps %%ymm1, %%ymm0, %%ymm2\n vmulps %%ymm0, %%ymm1, %%ymm3\n vmulps %%ymm1, %%ymm0, %%ymm4\n");
  for (int i = 0; i < 256; ++i) table[i] = (float)i;
  for (int i = 0; i < (1 << 16); ++i) codes[i] = (uint8_t)(i * 37);
  const long rounds = 5 * kRounds;
  double t = now();
  float sum = by_gather(rounds);
  printf("8 of 256 floats by a gather   %5.2f cycles (sum %g)\n", (now() - t) * ghz * 1e9 / rounds, sum);
  t = now();
  sum = by_loads(rounds);
  printf("8 of 256 floats by 8 loads    %5.2f cycles (sum %g)\n", (now() - t) * ghz * 1e9 / rounds, sum);
  if (__builtin_cpu_supports("avx512vbmi")) {
    for (int i = 0; i < 256; ++i) {
      uint32_t u;
      memcpy(&u, &table[i], 4);
      for (int p = 0; p < 4; ++p) planes[p][i] = (uint8_t)(u >> (8 * p));
    }
    static const struct {
      const char* name;
      float (*run)(long);
    } ways[] = {{"4 gathers  ", by_gather512}, {"64 loads   ", by_loads512}, {"byte planes", by_planes}};
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; ++w) {
      t = now();
      sum = ways[w].run(kRounds);
      printf("64 of 256 floats, %s %5.2f cycles / 16 (sum %g)\n", ways[w].name,
             (now() - t) * ghz * 1e9 / (kRounds * 4.0), sum);
    }
  }
  return 0;
}
