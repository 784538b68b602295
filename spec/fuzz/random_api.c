/*
** random_api.c -- the seeded random driver of fuzz_api.c (scripts/test/fuzz):
** random sequences of 1..max_calls calls, each a fresh input for the same
** target, so millions of sequences run under ASan + UBSan without
** libFuzzer's corpus work.  Half the sequences start by making objects
** (tensors, a strategy, metadata, a batch, a context, a layer, in random
** slots), so that the random calls after them reach forwards, searches and
** releases of live objects rather than failing on empty slots.  usage: random_api SEQUENCES [SEED [MAX_CALLS]]
** Prints the count, the time and the seed; a broken invariant traps (the
** sequence number and seed reproduce it: the bytes are splitmix64(seed, n)).
** RANDOM_API_DUMP=dir writes each sequence there too (seed corpus files).
*/
#include <time.h>

#include "fuzz_api.c"

static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: random_api SEQUENCES [SEED [MAX_CALLS]]\n");
    return 2;
  }
  long long n = atoll(argv[1]);
  uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
  int max_calls = argc > 3 ? atoi(argv[3]) : 24;
  uint8_t buf[3 * 300];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long long i = 0; i < n; i++) {
    uint64_t s = seed ^ ((uint64_t)i * 0xd1b54a32d192ed03ull);
    int calls = 1 + (int)(rnd(&s) % (uint64_t)max_calls), j = 0;
    if (rnd(&s) & 1) { /* op, slots, flags (fuzz_api.c's api_step) */
      static const uint8_t setup[][3] = {
        {0, 0, 0}, {0, 1, 0}, {0, 2, 0}, {0, 3, 0}, /* f32 tensors in slots 0-3 */
        {3, 0, 0},                                  /* strategy 0: 1 step, 3 layers */
        {6, 0, 0},                                  /* metadata 0: strategy 0's step 0, or search */
        {8, 0, 0},                                  /* batch 0 */
        {10, 0, 0},                                 /* push step 0, metadata 0, batch 0 */
        {12, 0, 0x40}};                             /* layer 0 (index 0) with strategy 0 */
      uint64_t r = rnd(&s);
      for (size_t k = 0; k < sizeof setup / sizeof setup[0]; k++) {
        buf[j++] = setup[k][0];
        buf[j++] = setup[k][1];
        uint8_t flags = setup[k][2] | (k < 4 && (r & 1) ? 0x10 : 0); /* or f16 tensors */
        if (setup[k][0] == 6 && (r & 2)) flags |= 0x80; /* or a search table */
        buf[j++] = flags;
      }
    }
    for (int c = 0; c < calls; c++)
      for (int b = 0; b < 3; b++) buf[j++] = (uint8_t)rnd(&s);
    if (getenv("RANDOM_API_DUMP")) {
      char path[512];
      snprintf(path, sizeof path, "%s/random-%llu-%lld", getenv("RANDOM_API_DUMP"),
               (unsigned long long)seed, i);
      FILE *f = fopen(path, "wb");
      if (f) { fwrite(buf, 1, (size_t)j, f); fclose(f); }
    }
    LLVMFuzzerTestOneInput(buf, (size_t)j);
    if ((i + 1) % 1000000 == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      printf("random_api: %lld sequences, %.0f s\n", i + 1,
             (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
      fflush(stdout);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("random_api: extreme-argument calls that succeeded: create %lld, view %lld, narrow "
         "%lld, wrap %lld, attention %lld, strategy/metadata/record %lld, elementwise %lld, "
         "geometry/tile %lld\n", (long long)api_ok[24], (long long)api_ok[25],
         (long long)api_ok[26], (long long)api_ok[27], (long long)api_ok[28],
         (long long)api_ok[29], (long long)api_ok[30], (long long)api_ok[31]);
  printf("random_api: calls that succeeded: layer forward %lld, attention %lld, SP forward %lld, "
         "search+tune %lld, strategy save+load %lld, push %lld, pop %lld\n",
         (long long)(api_ok[15] + api_ok[16]), (long long)api_ok[17], (long long)api_ok[21],
         (long long)api_ok[18], (long long)api_ok[19], (long long)api_ok[10], (long long)api_ok[11]);
  printf("random_api: %lld sequences of 1..%d calls, seed %llu, %.1f s, 0 failures\n", n,
         max_calls, (unsigned long long)seed,
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return 0;
}
