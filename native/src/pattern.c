/* pattern.c — incompressible write data and the offset-keyed verification pattern. */
#include <errno.h>
#include <string.h>

#include "engine.h"

#define UNIT 512u

uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed = mix64(seed);
        r->s[i] = seed;
    }
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t rng_below(struct rng *r, uint64_t n)
{
    /* Lemire's multiply-shift with rejection: exactly uniform */
    __uint128_t m = (__uint128_t)rng_next(r) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t floor = -n % n;
        while (low < floor) {
            m = (__uint128_t)rng_next(r) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

static void fill_words(struct rng *r, unsigned char *p, uint64_t len)
{
    uint64_t v;
    while (len >= 8) {
        v = rng_next(r);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len) {
        v = rng_next(r);
        memcpy(p, &v, len);
    }
}

int qual_fill_random(void *buf, uint64_t len, uint64_t seed)
{
    if (!buf && len)
        return qual_set_error(-EINVAL, "buffer is NULL");
    struct rng r;
    rng_seed(&r, seed);
    fill_words(&r, buf, len);
    return 0;
}

void stamp_write(void *buf, uint32_t len, uint64_t offset, uint64_t seq)
{
    uint32_t step = len >= 4096 ? 4096 : UNIT;
    unsigned char *p = buf;
    for (uint32_t at = 0; at + 16 <= len; at += step) {
        uint64_t o = offset + at;
        memcpy(p + at, &o, 8);
        memcpy(p + at + 8, &seq, 8);
    }
}

static void pattern_unit(unsigned char *p, uint64_t seed, uint64_t offset)
{
    struct rng r;
    memcpy(p, &offset, 8);
    memcpy(p + 8, &seed, 8);
    rng_seed(&r, seed ^ mix64(offset));
    fill_words(&r, p + 16, UNIT - 16);
}

static int pattern_args(const void *buf, uint64_t len, uint64_t offset)
{
    if (!buf)
        return qual_set_error(-EINVAL, "buffer is NULL");
    if (len % UNIT || offset % UNIT)
        return qual_set_error(-EINVAL, "length %llu and offset %llu must be multiples of %u",
                              (unsigned long long)len, (unsigned long long)offset, UNIT);
    return 0;
}

int qual_pattern_fill(void *buf, uint64_t len, uint64_t seed, uint64_t offset)
{
    int rc = pattern_args(buf, len, offset);
    if (rc)
        return rc;
    unsigned char *p = buf;
    for (uint64_t at = 0; at < len; at += UNIT)
        pattern_unit(p + at, seed, offset + at);
    return 0;
}

int qual_pattern_check(const void *buf, uint64_t len, uint64_t seed, uint64_t offset,
                       uint64_t *bad_offset)
{
    int rc = pattern_args(buf, len, offset);
    if (rc)
        return rc;
    const unsigned char *p = buf;
    unsigned char want[UNIT];
    for (uint64_t at = 0; at < len; at += UNIT) {
        pattern_unit(want, seed, offset + at);
        if (memcmp(p + at, want, UNIT) != 0) {
            if (bad_offset)
                *bad_offset = offset + at;
            return qual_set_error(-EBADMSG, "data at offset %llu does not match the pattern",
                                  (unsigned long long)(offset + at));
        }
    }
    return 0;
}
