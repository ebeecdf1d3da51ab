/* The clock and the throughput of the vector instructions docs/benchmarks.md reasons with (the divider's 5 and 6
 * cycles on AVX2, 10 and 12 on AVX-512; one blend or permute a cycle): each instruction in independent copies, so
 * that only its port or unit limits it. x86-64 with AVX-512; no PMU needed.
 *
 *     gcc -O2 -o /tmp/insn_throughput tools/insn_throughput.c && taskset -c 1 /tmp/insn_throughput
 */
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { kRounds = 20000000 };

/* A loop of 8 copies of the body (each `per` instructions) for kRounds rounds; cycles per instruction. */
#define TIME(name, per, body)                                                                              \
  do {                                                                                                     \
    long n = kRounds;                                                                                      \
    const double t0 = now();                                                                               \
    __asm__ volatile("vbroadcastss (%1), %%zmm0\n vbroadcastss 4(%1), %%zmm1\n"                          \
                     "1:\n" body body body body body body body body "dec %0\n jnz 1b"                     \
                     : "+r"(n) : "r"(operands) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "memory");        \
    printf("%-14s %5.2f cycles\n", name, (now() - t0) * ghz * 1e9 / (kRounds * 8.0 * (per)));             \
  } while (0)

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
  TIME("vdivps zmm", 1, "vdivps %%zmm1, %%zmm0, %%zmm2\n");
  TIME("vsqrtps zmm", 1, "vsqrtps %%zmm1, %%zmm2\n");
  TIME("vblendvps ymm", 3,
       "vblendvps %%ymm1, %%ymm0, %%ymm1, %%ymm2\n vblendvps %%ymm0, %%ymm1, %%ymm0, %%ymm3\n"
       " vblendvps %%ymm1, %%ymm0, %%ymm1, %%ymm4\n");
  TIME("vpermps ymm", 3,
       "vpermps %%ymm1, %%ymm0, %%ymm2\n vpermps %%ymm0, %%ymm1, %%ymm3\n vpermps %%ymm1, %%ymm0, %%ymm4\n");
  TIME("vpaddd ymm", 3, "vpaddd %%ymm1, %%ymm0, %%ymm2\n vpaddd %%ymm0, %%ymm1, %%ymm3\n vpaddd %%ymm1, %%ymm0, %%ymm4\n");
  TIME("vmulps ymm", 3, "vmulps %%ymm1, %%ymm0, %%ymm2\n vmulps %%ymm0, %%ymm1, %%ymm3\n vmulps %%ymm1, %%ymm0, %%ymm4\n");
  return 0;
}
