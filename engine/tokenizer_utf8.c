/* tokenizer_utf8: strict UTF-8 decoding/encoding helpers for the tokenizers (RFC 3629, Unicode §3.9 table 3-7). */
#include "tokenizer_internal.h"

/* Valid range of the second byte for a lead byte, and the sequence length (0 = not a lead).
 * Unicode 15, §3.9, table 3-7 "Well-Formed UTF-8 Byte Sequences". */
static size_t lead_info(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;             /* continuation bytes, C0/C1 overlongs */
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo = 0xA0;      /* no overlongs */
        if (b == 0xED) *hi = 0x9F;      /* no surrogates */
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;      /* <= U+10FFFF */
        return 4;
    }
    return 0;
}

size_t utf8_valid_prefix(const unsigned char *s, size_t n, size_t *need)
{
    unsigned char lo, hi;
    size_t len = lead_info(s[0], &lo, &hi);
    *need = len;
    if (len == 0) return 0;
    size_t k = 1;
    while (k < len && k < n) {
        unsigned char c = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) break;
        k++;
    }
    return k;
}

size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t need;
    size_t k = utf8_valid_prefix(s, n, &need);
    if (need == 0 || k < need) {
        *cp = UTF8_INVALID;
        return 1;
    }
    uint32_t c;
    switch (need) {
    case 1: c = s[0]; break;
    case 2: c = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: c = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    default:
        c = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
            ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        break;
    }
    *cp = c;
    return need;
}

size_t utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
