/* crc32c.c — CRC32C (Castagnoli): the SSE4.2 instruction where the CPU has it, else a table. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "engine.h"

#define POLY 0x82f63b78u /* CRC32C, reflected */

static uint32_t table[8][256];
static int table_ready;

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

/* slicing-by-8 */
static uint32_t crc_soft(uint32_t crc, const unsigned char *p, uint64_t len)
{
    if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE))
        make_table();
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^
              table[2][(v >> 40) & 0xff] ^ table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_hw1(uint32_t crc, const unsigned char *p,
                                                           uint64_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}

/* Three streams at once: the crc32 instruction takes three cycles and issues one per cycle,
 * so three independent stripes of STRIPE bytes run in the time of one. Their states join with
 * shift(): the state after STRIPE zero bytes, a linear map of the state held in four tables
 * (built once from the 32 basis states). */
#define STRIPE 8192u

static uint32_t shift_table[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

static void make_shift(void)
{
    static const unsigned char zeros[STRIPE];
    uint32_t basis[32];
    for (int i = 0; i < 32; i++)
        basis[i] = crc_hw1(1u << i, zeros, STRIPE);
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int bit = 0; bit < 8; bit++)
                if (b >> bit & 1)
                    v ^= basis[8 * k + bit];
            shift_table[k][b] = v;
        }
}

static inline uint32_t shift(uint32_t s)
{
    return shift_table[0][s & 0xff] ^ shift_table[1][s >> 8 & 0xff] ^
           shift_table[2][s >> 16 & 0xff] ^ shift_table[3][s >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                          uint64_t len)
{
    if (len >= 3 * STRIPE)
        pthread_once(&shift_once, make_shift);
    while (len >= 3 * STRIPE) {
        uint64_t a = crc, b = 0, c = 0;
        for (unsigned i = 0; i < STRIPE; i += 8) {
            uint64_t x, y, z;
            memcpy(&x, p + i, 8);
            memcpy(&y, p + STRIPE + i, 8);
            memcpy(&z, p + 2 * STRIPE + i, 8);
            a = _mm_crc32_u64(a, x);
            b = _mm_crc32_u64(b, y);
            c = _mm_crc32_u64(c, z);
        }
        crc = shift(shift((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        p += 3 * STRIPE;
        len -= 3 * STRIPE;
    }
    return crc_hw1(crc, p, len);
}

static int have_hw(void)
{
    return __builtin_cpu_supports("sse4.2");
}
#else
static uint32_t crc_hw(uint32_t crc, const unsigned char *p, uint64_t len)
{
    return crc_soft(crc, p, len);
}

static int have_hw(void)
{
    return 0;
}
#endif

uint32_t crc32c(uint32_t crc, const void *buf, uint64_t len)
{
    static int hw = -1;
    if (hw < 0)
        hw = have_hw();
    crc = ~crc;
    crc = hw ? crc_hw(crc, buf, len) : crc_soft(crc, buf, len);
    return ~crc;
}

int qual_crc32c(uint32_t crc, const void *buf, uint64_t len, uint32_t *out)
{
    if ((!buf && len) || !out)
        return qual_set_error(-EINVAL, "buffer or output is NULL");
    *out = crc32c(crc, buf, len);
    return 0;
}

int qual_crc32c_hardware(int *yes)
{
    if (!yes)
        return qual_set_error(-EINVAL, "output is NULL");
    *yes = have_hw();
    return 0;
}
