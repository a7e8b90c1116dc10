/* megapilot.logs._scan: the compiled engine of summary-only log reading (megapilot/logs/bulk.py).

One call, Scanner.scan, walks a block of complete lines and does in C what the pure-Python engine does
with regexes and SummaryBuilder.add_rows:

- A canonical Megatron-LM iteration line (FAST_ITERATION_RE's language, its prefix rules) is parsed by
  a hand-written matcher and folded straight into the summary's state: the same integer and float
  operations, in the same order, as SummaryBuilder.add_rows, so every double is bit-identical.
- Any other line is checked for the needles the line parser reacts to (passed in from Python) and for
  control or non-ASCII bytes. A needle occurrence may be declared inert (its only effect in summary-only
  mode is a record the collector drops): such lines are skipped like needle-free lines.
- Whatever needs Python stops the scan at that line: a line with a live needle, an iteration line the
  matcher is not sure of, a row bound for the warm-up head or carrying the first timestamp, a number that
  would overflow. Python handles that line exactly as the pure-Python engine does, then scans on.

With a row list (scan's rows_out: a reader with a row hook, bulk.py RowLine), each row folded is also handed
over: its offsets and values, whether its other fields leave those values the record's anomaly fields, and its
prefix's time when the prefix has the usual one-timestamp shape (the arithmetic of calendar.timegm).

Timestamps stay lazy: the spans of lines and prefixes that may hold one (a cheap shape test, a necessary
condition of the Python regex) are kept, and Python reads only the last ones (pop_time, pop_counted).
Numbers: decimal text of at most 15 digits and a small exponent is converted by one exact IEEE division
or multiplication (correctly rounded, as Python's float() is); anything else goes through
PyOS_string_to_double, the function float() itself uses. Reservoir replacements past RESERVOIR_SIZE draw
from the summary's own random.Random, in the order `_Running._reservoir_step` draws. Build without -ffast-math and with
-ffp-contract=off: a fused multiply-add would change the Welford sums. */

#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { STOP_END = 0, STOP_LINE = 1, STOP_FALLBACK = 2 };
enum { TIME_PREFIX = 0, TIME_LINE = 1 };
enum { INERT_NEVER = 0, INERT_ALWAYS = 1, INERT_BEFORE_SUFFIX = 2, INERT_UNLESS_ITERATION = 3, INERT_IN_CHATTER = 4 };

#define MAX_EXACT_INT 9007199254740992LL /* 2**53 */

typedef struct {
    Py_ssize_t start, end;
    int kind;
} Span;

typedef struct {
    Span *items;
    Py_ssize_t size, capacity;
} Spans;

typedef struct {
    char *text;
    Py_ssize_t length;
    int rule;
    char *suffix;
    Py_ssize_t suffix_length;
} Needle;

/* A needle's 4-byte window (case folded) in the chatter filter: the needle starts `offset` bytes before it. */
typedef struct {
    uint32_t gram;
    int offset;
    Py_ssize_t needle;
} ChatterGram;

typedef struct {
    PyObject_HEAD
    Needle *needles;
    Py_ssize_t needle_count;
    Py_ssize_t first_start[257]; /* needles sorted by first byte: those starting with byte b are [first_start[b], first_start[b + 1]) */
    uint64_t pairs[1024];        /* bit (a << 8 | b): some needle starts with the two bytes a, b */
    int has_short_needle;        /* a needle of one byte: the pair filter cannot be used */
    int has_pair_needle;         /* a needle of two bytes that can be live: the gram filters cannot be used */
    uint64_t grams4[1024];       /* hashed 4-byte windows (case folded) of needles of 5 bytes or more, at offsets 0, 1 */
    uint64_t grams3[1024];       /* hashed first 3 bytes (case folded) of the needles that can be live */
    uint64_t chatter_grams3[1024]; /* the same, of those that can be live on NCCL/RCCL chatter */
    unsigned char *chatter_grams4; /* hashed 4-byte windows (case folded) of those, two adjacent ones per needle: a
                                      byte per hash (64 KiB; a load instead of a load, shift and mask per window) */
    ChatterGram *chatter_windows;  /* those windows: which needle holds each, at which offset */
    Py_ssize_t chatter_window_count;
    int chatter_stride2;           /* all of those have 5 bytes or more: chatter_grams4 at every second position */
    char **keys;                 /* field keys the free-field loop must not accept (the summary's own) */
    Py_ssize_t *key_lengths;
    Py_ssize_t key_count;
    uint64_t key_lengths_by_first[256]; /* bit n of entry b: an excluded key of n bytes starts with b (a quick no) */
    long long reservoir_size, warmup_cap;
    Spans times, counted;
} Scanner;

/* ---- the summary's state, loaded from SummaryBuilder at the start of a scan and stored back at its end ---- */
typedef struct {
    long long logged, counted, max_counted, first_iteration, train_iters, nan_total, skipped_total;
    long long checkpoint_dropped, count, next_replace, tokens_count, tflops_count;
    int has_max, has_first_iteration, has_train_iters, has_nan_total, has_skipped_total, save_pending;
    int has_first_loss, has_final_loss, has_min_loss, needs_first_time;
    double first_loss, final_loss, min_loss, mean, m2, minimum, maximum, tokens_total, tflops_total;
    double tokens_weight, tflops_weight; /* the step times the rates are weighted by (summary.py `_Mean`) */
    Py_ssize_t head_length;
    double weight;                                 /* `_Running._weight` (Li's Algorithm L), once the reservoir is full */
    PyObject *after, *reservoir, *tokens, *tflops; /* owned during a scan */
    PyObject *random, *getrandbits;                /* the summary's generator's methods, fetched when first needed */
} State;

typedef struct {
    long long iteration, train_iters, gbs, skipped, nan;
    double elapsed, tflops, loss;
    int has_tflops, loss_finite, has_loss;
    const char *fields_start, *fields_end; /* the fields after the loss, before ` number of skipped iterations:` */
} Row;

static PyObject *s_max_counted, *s_counted, *s_logged, *s_train_iters, *s_first_iteration, *s_first_loss;
static PyObject *s_final_loss, *s_min_loss, *s_nan_iterations, *s_skipped_iterations, *s_save_pending;
static PyObject *s_checkpoint_dropped, *s_head, *s_after_head, *s_tokens_after_head, *s_tflops_after_head;
static PyObject *s_first_time, *s_count, *s_mean, *s_m2, *s_minimum, *s_maximum, *s_reservoir, *s_next_replace;
static PyObject *s_total, *s_random, *s_weight, *s_random_method, *s_getrandbits, *s_mean_weight;

static const double POWERS_OF_TEN[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                         1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* ---- spans ------------------------------------------------------------------------------------------------ */
static int spans_push(Spans *spans, Py_ssize_t start, Py_ssize_t end, int kind) {
    if (spans->size == spans->capacity) {
        Py_ssize_t capacity = spans->capacity ? spans->capacity * 2 : 256;
        Span *items = PyMem_Realloc(spans->items, (size_t)capacity * sizeof(Span));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        spans->items = items;
        spans->capacity = capacity;
    }
    spans->items[spans->size].start = start;
    spans->items[spans->size].end = end;
    spans->items[spans->size].kind = kind;
    spans->size++;
    return 0;
}

/* ---- timestamps: a necessary condition of TIMESTAMP_RE (\d{4}-?\d\d-?\d\d[ T_]\d\d:\d\d:\d\d) --------------- */
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline int digits_at(const unsigned char *p, Py_ssize_t at, Py_ssize_t n, Py_ssize_t count) {
    if (at + count > n) return 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (!is_digit(p[at + i])) return 0;
    return 1;
}

/* Whether a timestamp's shape starts at p[at] and ends by p[n]: date with or without dashes, then the time. */
static inline int clock_at(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    if (at >= n || (p[at] != ' ' && p[at] != 'T' && p[at] != '_')) return 0;
    return digits_at(p, at + 1, n, 2) && at + 3 < n && p[at + 3] == ':' && digits_at(p, at + 4, n, 2) &&
           at + 6 < n && p[at + 6] == ':' && digits_at(p, at + 7, n, 2);
}

static inline int day_at(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    if (at < n && p[at] == '-' && digits_at(p, at + 1, n, 2) && clock_at(p, at + 3, n)) return 1;
    return digits_at(p, at, n, 2) && clock_at(p, at + 2, n);
}

static inline int timestamp_at(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    if (!digits_at(p, at, n, 4)) return 0;
    at += 4;
    if (at < n && p[at] == '-' && digits_at(p, at + 1, n, 2) && day_at(p, at + 3, n)) return 1;
    return digits_at(p, at, n, 2) && day_at(p, at + 2, n);
}

static int has_timestamp(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 17 <= n; i++) /* the shortest form (no dashes) is 17 bytes */
        if (is_digit(p[i]) && timestamp_at(p, i, n)) return 1;
    return 0;
}

/* leading_time's condition: a digit in the first 40 characters and a timestamp within the first 96. */
static int may_lead_with_time(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t head = n < 96 ? n : 96, digits = n < 40 ? n : 40, i;
    for (i = 0; i < digits && !is_digit(p[i]); i++) {
    }
    return i < digits && has_timestamp(p, head);
}

/* ---- numbers ---------------------------------------------------------------------------------------------- */
/* A decimal as mantissa x 10**exponent: float() of it is one exact IEEE operation when the mantissa has at most 15
   digits and the power of ten is within 1e±22 (both operands exact, one correct rounding); else `slow`. */
typedef struct {
    uint64_t mantissa;
    int exponent, slow;
} Decimal;


static int float_of_text(const char *text, Py_ssize_t n, double *out);

/* float(text[0:n]) where text[0:n] was read into d (sign included in text; negative: it is '-') */
static inline int decimal_value(const Decimal *d, int negative, const char *text, Py_ssize_t n, double *out) {
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
    int exact = 0; /* excess precision (x87): one rounding is not guaranteed */
#else
    int exact = !d->slow && d->exponent >= -22 && d->exponent <= 22;
#endif
    if (!exact) return float_of_text(text, n, out);
    double value = (double)d->mantissa; /* exact: at most 15 digits */
    value = d->exponent < 0 ? value / POWERS_OF_TEN[-d->exponent] : value * POWERS_OF_TEN[d->exponent];
    *out = negative ? -value : value;
    return 0;
}

/* float(text[0:n]) by the function float() itself calls (correctly rounded, locale-independent) */
static int float_of_text(const char *text, Py_ssize_t n, double *out) {
    char *end = NULL;
    double value = PyOS_string_to_double(text, &end, NULL);
    if (value == -1.0 && PyErr_Occurred()) return -1;
    if (end != text + n) {
        PyErr_SetString(PyExc_ValueError, "number span not consumed");
        return -1;
    }
    *out = value;
    return 0;
}

/* ---- the iteration line matcher (a strict reading of FAST_ITERATION_RE) ----------------------------------- */
typedef struct {
    const char *p, *end;
} Cursor;

/* a == b over n bytes, eight at a time (inlined: the literals' lengths are constants) */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    uint64_t x, y;
    uint32_t u, v;
    if (n >= 8) { /* whole words, then the last eight bytes (overlapping) */
        for (Py_ssize_t i = 0; i + 8 <= n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) return 0;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        memcpy(&u, a, 4);
        memcpy(&v, b, 4);
        if (u != v) return 0;
        memcpy(&u, a + n - 4, 4);
        memcpy(&v, b + n - 4, 4);
        return u == v;
    }
    for (; n > 0; n--)
        if (*a++ != *b++) return 0;
    return 1;
}

static inline int literal(Cursor *c, const char *text, Py_ssize_t n) {
    if (c->end - c->p < n || !same_bytes(c->p, text, n)) return 0;
    c->p += n;
    return 1;
}
#define LITERAL(cursor, text) literal(cursor, text, (Py_ssize_t)sizeof(text) - 1)

static inline unsigned char lower(unsigned char ch) { return ch >= 'A' && ch <= 'Z' ? (unsigned char)(ch + 32) : ch; }

/* ---- eight bytes at a time (SWAR) where the byte order allows it ---- */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static inline uint64_t load8(const char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

#else
#define SWAR 0
#endif

static const uint64_t POWERS_OF_TEN_INT[16] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
                                               10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL,
                                               100000000000ULL, 1000000000000ULL, 10000000000000ULL,
                                               100000000000000ULL, 1000000000000000ULL};

/* digits[.digits] read as two runs: at most 15 digits in all make an exact mantissa (below 2**53); more go to
   float() (exact either way). */
static inline void decimal_from_runs(Decimal *d, Py_ssize_t whole_digits, uint64_t whole, Py_ssize_t fraction_digits,
                                     uint64_t fraction) {
    d->slow = whole_digits + fraction_digits > 15;
    d->mantissa = d->slow ? 0 : whole * POWERS_OF_TEN_INT[fraction_digits] + fraction;
    d->exponent = -(int)fraction_digits;
}

/* A run of ASCII digits: how many (any number), and their value when there are at most 19 (runs are short:
   a byte loop beats eight-byte tricks here). */
static inline Py_ssize_t digit_run(Cursor *c, uint64_t *value) {
    const char *start = c->p;
    uint64_t v = 0;
    for (; c->p < c->end && is_digit((unsigned char)*c->p); c->p++) v = v * 10 + (uint64_t)(*c->p - '0');
    *value = v;
    return c->p - start;
}

static inline Py_ssize_t spaces(Cursor *c) {
    const char *start = c->p;
#if SWAR
    while (c->end - c->p >= 8) {
        uint64_t others = load8(c->p) ^ (ONES * ' ');
        if (others) {
            c->p += __builtin_ctzll(others) >> 3;
            return c->p - start;
        }
        c->p += 8;
    }
#endif
    while (c->p < c->end && *c->p == ' ') c->p++;
    return c->p - start;
}

/* [0-9]{1,15} */
static inline int integer(Cursor *c, long long *out) {
    uint64_t value;
    Py_ssize_t n = digit_run(c, &value);
    *out = (long long)value;
    return n >= 1 && n <= 15;
}

/* ` +[0-9]{1,15} \|` whose value is not needed */
static inline int spaced_digits(Cursor *c) {
    if (spaces(c) < 1) return 0;
    const char *start = c->p;
    while (c->p < c->end && is_digit((unsigned char)*c->p)) c->p++;
    return c->p - start >= 1 && c->p - start <= 15 && LITERAL(c, " |");
}

/* ` +INT \|` */
static inline int spaced_integer(Cursor *c, long long *out) {
    return spaces(c) >= 1 && integer(c, out) && LITERAL(c, " |");
}

/* [0-9]{1,15}(?:\.[0-9]{1,15})? followed by ` |` */
static inline int number(Cursor *c, double *out) {
    const char *start = c->p;
    Decimal d;
    uint64_t whole, fraction = 0;
    Py_ssize_t whole_digits = digit_run(c, &whole), fraction_digits = 0;
    if (whole_digits < 1 || whole_digits > 15) return 0;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        fraction_digits = digit_run(c, &fraction);
        if (fraction_digits < 1 || fraction_digits > 15) return 0;
    }
    decimal_from_runs(&d, whole_digits, whole, fraction_digits, fraction);
    Py_ssize_t length = c->p - start;
    if (!LITERAL(c, " |")) return 0;
    return decimal_value(&d, 0, start, length, out) < 0 ? -1 : 1;
}

static int one_of(Cursor *c, const char *a, const char *b, const char *d) {
    return literal(c, a, 3) || literal(c, b, 3) || literal(c, d, 3);
}

/* [-+]?(?:[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|nan|NaN|NAN|inf|Inf|INF) followed by ` |` */
static int loss_value(Cursor *c, Row *row) {
    const char *start = c->p;
    int negative = 0;
    if (c->p < c->end && (*c->p == '-' || *c->p == '+')) negative = *c->p++ == '-';
    if (c->p < c->end && is_digit((unsigned char)*c->p)) {
        Decimal d;
        uint64_t whole, fraction = 0;
        Py_ssize_t whole_digits = digit_run(c, &whole), fraction_digits = 0;
        if (c->p < c->end && *c->p == '.') {
            c->p++;
            fraction_digits = digit_run(c, &fraction);
            if (fraction_digits == 0) return 0;
        }
        decimal_from_runs(&d, whole_digits, whole, fraction_digits, fraction);
        if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
            int exponent_negative = 0, value = 0;
            c->p++;
            if (c->p < c->end && (*c->p == '-' || *c->p == '+')) exponent_negative = *c->p++ == '-';
            const char *digits = c->p;
            for (; c->p < c->end && is_digit((unsigned char)*c->p); c->p++) {
                if (c->p - digits >= 4) d.slow = 1; /* a long exponent: float() reads it */
                else value = value * 10 + (*c->p - '0');
            }
            if (c->p == digits) return 0;
            d.exponent += exponent_negative ? -value : value;
        }
        if (decimal_value(&d, negative, start, c->p - start, &row->loss) < 0) return -1;
        /* finite unless float() read it (a fast value is finite: reading it back here would wait for the division) */
        row->loss_finite = !d.slow && d.exponent >= -22 && d.exponent <= 22 ? 1 : isfinite(row->loss);
    } else if (one_of(c, "nan", "NaN", "NAN") || one_of(c, "inf", "Inf", "INF")) {
        row->loss_finite = 0;
    } else {
        return 0;
    }
    row->has_loss = 1;
    return LITERAL(c, " |");
}

/* `_VALUE\|`: printable ASCII but `|`, then `|` */
static inline int value_then_bar(Cursor *c) {
    for (; c->p < c->end && *c->p != '|'; c->p++) { /* values are short: a loop beats a call to memchr */
        unsigned char ch = (unsigned char)*c->p;
        if (ch < 0x20 || ch > 0x7e) return 0;
    }
    if (c->p == c->end) return 0;
    c->p++;
    return 1;
}

/* The bytes of a free field's key: [a-z0-9_] and the space between words. */
static const unsigned char KEY_BYTES[256] = {
    [' '] = 1, ['_'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
    ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

/* ` KEY:VALUE|` of the free-field loop: KEY is [a-z0-9_]+(?: [a-z0-9_]+)* and not one of the summary's keys. */
static int free_field(const Scanner *self, Cursor *c) {
    /* the usual keys, spelled out as the regex spells them: valid keys, none of them excluded */
    if (LITERAL(c, " loss scale:") || LITERAL(c, " grad norm:") || LITERAL(c, " num zeros:") ||
        LITERAL(c, " params norm:"))
        return value_then_bar(c);
    if (!LITERAL(c, " ")) return 0;
    const char *key = c->p;
    char previous = ' ';
    while (c->p < c->end && *c->p != ':') {
        char ch = *c->p++;
        if (!KEY_BYTES[(unsigned char)ch] || (ch == ' ' && previous == ' ')) return 0;
        previous = ch;
    }
    Py_ssize_t n = c->p - key;
    if (n == 0 || previous == ' ' || c->p == c->end) return 0;
    if (n < 64 && (self->key_lengths_by_first[(unsigned char)key[0]] >> n & 1))
        for (Py_ssize_t k = 0; k < self->key_count; k++)
            if (self->key_lengths[k] == n && memcmp(self->keys[k], key, (size_t)n) == 0) return 0;
    c->p++; /* the colon */
    return value_then_bar(c);
}

/* 1 when the line from "iteration" to its newline is a whole canonical line (row filled, *newline set), 0 when not
   sure, -1 on error. `limit`: the end of the block; no part of the line's grammar takes a newline, so the matcher
   stops at the line's end by itself. */
static int match_iteration(const Scanner *self, const char *at, const char *limit, Row *row, const char **newline) {
    Cursor cursor = {at + 9, limit}, *c = &cursor;
    int ok;
    *row = (Row){0}; /* a compound literal: stores the compiler sizes, not a `rep stos` for 100 bytes */
    if (spaces(c) < 1 || !integer(c, &row->iteration) || !LITERAL(c, "/")) return 0;
    spaces(c);
    if (!integer(c, &row->train_iters) || !LITERAL(c, " | consumed samples:") || !spaced_digits(c))
        return 0;
    if (LITERAL(c, " skipped samples:") && !spaced_digits(c)) return 0;
    if (!LITERAL(c, " elapsed time per iteration (ms): ")) return 0;
    if ((ok = number(c, &row->elapsed)) <= 0) return ok;
    if (LITERAL(c, " throughput per GPU (TFLOP/s/GPU): ")) {
        if ((ok = number(c, &row->tflops)) <= 0) return ok;
        row->has_tflops = 1;
    }
    if (LITERAL(c, " learning rate:") && !value_then_bar(c)) return 0;
    if (LITERAL(c, " decoupled learning rate:") && !value_then_bar(c)) return 0;
    if (!LITERAL(c, " global batch size:") || !spaced_integer(c, &row->gbs)) return 0;
    if (LITERAL(c, " lm loss:")) {
        if (spaces(c) < 1) return 0;
        if ((ok = loss_value(c, row)) <= 0) return ok;
    }
    row->fields_start = c->p;
    for (;;) {
        row->fields_end = c->p;
        if (LITERAL(c, " number of skipped iterations:")) break;
        if (!free_field(self, c)) return 0;
    }
    if (!spaced_integer(c, &row->skipped) || !LITERAL(c, " number of nan iterations:") ||
        !spaced_integer(c, &row->nan))
        return 0;
    spaces(c);
    if (c->p == c->end || *c->p != '\n') return 0;
    *newline = c->p;
    return 1;
}

/* The prefix rules of the Python engine, stricter: printable ASCII only (a tab sends the line to Python), no
   `[rank-`, no word byte before `iteration`. */
static inline int primus_rank_at(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    return n - at >= 6 && memcmp(p + at, "[rank-", 6) == 0;
}

static int prefix_ok(const unsigned char *p, Py_ssize_t n, int printable) {
    Py_ssize_t i = 0;
    if (printable) { /* the line pass found no control or non-ASCII byte: only `[rank-` and the last byte to test */
        for (const unsigned char *bracket = memchr(p, '[', (size_t)n); bracket != NULL;
             bracket = memchr(bracket + 1, '[', (size_t)(p + n - bracket - 1)))
            if (primus_rank_at(p, bracket - p, n)) return 0;
        i = n;
    }
#if SWAR
    for (; i + 8 <= n; i += 8) { /* a byte below 0x20 or above 0x7e (0x7f-0xff included) marks its high bit */
        uint64_t x = load8((const char *)p + i), brackets = x ^ (ONES * '[');
        if ((((x - ONES * 0x20) & ~x) | ((x + ONES * (127 - 0x7e)) | x)) & HIGHS) return 0;
        /* every `[` marks its high bit here (and maybe a byte above one): each marked byte is checked */
        for (uint64_t marks = (brackets - ONES) & ~brackets & HIGHS; marks; marks &= marks - 1) {
            Py_ssize_t at = i + (__builtin_ctzll(marks) >> 3);
            if (p[at] == '[' && primus_rank_at(p, at, n)) return 0;
        }
    }
#endif
    for (; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e || (p[i] == '[' && primus_rank_at(p, i, n))) return 0;
    if (n == 0) return 1;
    unsigned char last = p[n - 1];
    return !((last >= 'a' && last <= 'z') || (last >= 'A' && last <= 'Z') || is_digit(last) || last == '_');
}

/* The first i in [from, n - 1) with p[i] == a and p[i + 1] == b, or -1; `fold`: bytes OR 0x20 first (ASCII letters
   compared without case). Eight positions per step: the lowest zero byte of (x ^ a) | (y ^ b) is a true hit (the
   borrow of the zero-byte test only marks bytes above a true zero), so the first hit is exact. */
static inline Py_ssize_t find_pair(const unsigned char *p, Py_ssize_t from, Py_ssize_t n, unsigned char a,
                                   unsigned char b, int fold) {
    Py_ssize_t i = from;
    unsigned char f = fold ? 0x20 : 0;
#if SWAR
    uint64_t folds = ONES * f;
    for (; i + 9 <= n; i += 8) {
        uint64_t z = ((load8((const char *)p + i) | folds) ^ (ONES * a)) |
                     ((load8((const char *)p + i + 1) | folds) ^ (ONES * b));
        uint64_t hits = (z - ONES) & ~z & HIGHS;
        if (hits) return i + (__builtin_ctzll(hits) >> 3);
    }
#endif
    for (; i + 1 < n; i++)
        if ((p[i] | f) == a && (p[i + 1] | f) == b) return i;
    return -1;
}

/* ---- one pass from a line's start: where it ends or holds `it`, and what its bytes before there hold ---------- */
/* What a line's bytes before the pass stopped hold (hints: a set bit may be a byte the exact test then clears, a clear
   bit is certain): LINE_CONTROL, a byte below 0x20 or above 0x7e (tab and \r included); LINE_AI, `ai` in any case
   (holds_fail's pair). LINE_UNKNOWN: not looked at. */
enum { LINE_CONTROL = 1, LINE_AI = 2, LINE_UNKNOWN = -1 };

/* The first i >= from with p[i] a newline or p[i:i + 2] == "it" (p[from:end] holds a newline), and in *flags what
   p[from:i] holds. Eight positions a step: each test marks its first true hit lowest (a borrow only marks bytes
   above a true one), so the lowest mark of the newline and `it` tests is exact, and the hints of the bytes below it
   are. */
static Py_ssize_t line_pass_swar(const unsigned char *p, Py_ssize_t from, Py_ssize_t end, int *flags) {
    Py_ssize_t i = from;
    uint64_t control = 0, ai = 0;
#if SWAR
    for (; i + 9 <= end; i += 8) {
        uint64_t x = load8((const char *)p + i), y = load8((const char *)p + i + 1), newlines = x ^ (ONES * '\n');
        uint64_t pairs = (x ^ (ONES * 'i')) | (y ^ (ONES * 't'));
        uint64_t hits = (((pairs - ONES) & ~pairs) | ((newlines - ONES) & ~newlines)) & HIGHS;
        uint64_t controls = ((x - ONES * 0x20) & ~x) | ((x + ONES * (127 - 0x7e)) | x);
        uint64_t folded = ((x | ONES * 0x20) ^ (ONES * 'a')) | ((y | ONES * 0x20) ^ (ONES * 'i'));
        uint64_t ais = (folded - ONES) & ~folded;
        if (hits) {
            int below = __builtin_ctzll(hits) >> 3; /* bytes [0, below) of the word precede the hit */
            uint64_t mask = below ? ~0ULL >> (64 - 8 * below) : 0;
            control |= controls & mask;
            ai |= ais & mask;
            i += below;
            goto done;
        }
        control |= controls;
        ai |= ais;
    }
#endif
    for (; i < end; i++) {
        if (p[i] == '\n' || (p[i] == 'i' && i + 1 < end && p[i + 1] == 't')) break;
        if (p[i] < 0x20 || p[i] > 0x7e) control = ~0ULL;
        if (lower(p[i]) == 'a' && i + 1 < end && lower(p[i + 1]) == 'i') ai = ~0ULL;
    }
#if SWAR
done:
#endif
    /* a byte's mark is its high bit */
    *flags |= (control & 0x8080808080808080ULL ? LINE_CONTROL : 0) | (ai & 0x8080808080808080ULL ? LINE_AI : 0);
    return i;
}

/* The same pass 32 positions a step (AVX2, chosen at import where the CPU has it: `use_vectors`). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_PASS 1
#include <immintrin.h>
__attribute__((target("avx2"))) static Py_ssize_t line_pass_avx2(const unsigned char *p, Py_ssize_t from,
                                                                 Py_ssize_t end, int *flags) {
    Py_ssize_t i = from;
    uint32_t control = 0, ai = 0;
    const __m256i newline = _mm256_set1_epi8('\n'), letter_i = _mm256_set1_epi8('i'), letter_t = _mm256_set1_epi8('t');
    const __m256i letter_a = _mm256_set1_epi8('a'), fold = _mm256_set1_epi8(0x20), del = _mm256_set1_epi8(0x7f);
    for (; i + 33 <= end; i += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(p + i)), y = _mm256_loadu_si256((const __m256i *)(p + i + 1));
        uint32_t hits = (uint32_t)_mm256_movemask_epi8(_mm256_or_si256(
            _mm256_cmpeq_epi8(x, newline), _mm256_and_si256(_mm256_cmpeq_epi8(x, letter_i), _mm256_cmpeq_epi8(y, letter_t))));
        /* signed: 0x80-0xff are negative, so `0x20 > x` holds for them and for the control bytes */
        uint32_t controls = (uint32_t)_mm256_movemask_epi8(
            _mm256_or_si256(_mm256_cmpgt_epi8(fold, x), _mm256_cmpeq_epi8(x, del)));
        uint32_t ais = (uint32_t)_mm256_movemask_epi8(_mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_or_si256(x, fold), letter_a), _mm256_cmpeq_epi8(_mm256_or_si256(y, fold), letter_i)));
        if (hits) {
            int below = __builtin_ctz(hits);
            uint32_t mask = below ? 0xFFFFFFFFu >> (32 - below) : 0;
            *flags |= ((control | (controls & mask)) ? LINE_CONTROL : 0) | ((ai | (ais & mask)) ? LINE_AI : 0);
            return i + below;
        }
        control |= controls;
        ai |= ais;
    }
    *flags |= (control ? LINE_CONTROL : 0) | (ai ? LINE_AI : 0);
    return line_pass_swar(p, i, end, flags);
}
#else
#define HAVE_AVX2_PASS 0
#endif

static int vectors_usable(void) {
#if HAVE_AVX2_PASS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static int use_avx2_pass = 0; /* set at import (`vectors_usable`), or by use_vectors() */

/* The line starting at p[from] (p[from:end] holds its newline): where its newline is, or (*newline left NULL) where
   `iteration` first occurs in it; *flags: what the bytes before that hold (LINE_CONTROL, LINE_AI). */
static inline const char *find_iteration_in_line(const char *p, Py_ssize_t from, Py_ssize_t end, const char **newline,
                                                 int *flags) {
    const unsigned char *u = (const unsigned char *)p;
    for (Py_ssize_t i = from;; i++) {
#if HAVE_AVX2_PASS
        i = use_avx2_pass ? line_pass_avx2(u, i, end, flags) : line_pass_swar(u, i, end, flags);
#else
        i = line_pass_swar(u, i, end, flags);
#endif
        if (i >= end || p[i] == '\n') {
            *newline = p + i;
            return NULL;
        }
        if (end - i >= 9 && memcmp(p + i, "iteration", 9) == 0) return p + i;
    }
}

/* ---- other lines: does the line parser have anything to do with it? --------------------------------------- */

static int lower_equal(const unsigned char *p, const char *needle, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (lower(p[i]) != (unsigned char)needle[i]) return 0;
    return 1;
}

/* ITERATION_RE's shape after `iteration`: \s+\d+\s*\/\s*\d+\s*\| (the line holds only spaces and tabs as \s). */
static int iteration_record_follows(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    Py_ssize_t i = at, mark;
    for (mark = i; i < n && (p[i] == ' ' || p[i] == '\t'); i++) {
    }
    if (i == mark) return 0;
    for (mark = i; i < n && is_digit(p[i]); i++) {
    }
    if (i == mark) return 0;
    for (; i < n && (p[i] == ' ' || p[i] == '\t'); i++) {
    }
    if (i >= n || p[i++] != '/') return 0;
    for (; i < n && (p[i] == ' ' || p[i] == '\t'); i++) {
    }
    for (mark = i; i < n && is_digit(p[i]); i++) {
    }
    if (i == mark) return 0;
    for (; i < n && (p[i] == ' ' || p[i] == '\t'); i++) {
    }
    return i < n && p[i] == '|';
}

/* NCCL/RCCL chatter, as `signatures.match_line` tells it: `nccl info` or `rccl info` and no `fail` (one segment:
   a `\r` would make each segment a line of its own). On it no error signature matches, so a needle that is only a
   signature's trigger does nothing. -1: not decided yet. */
static int holds_fail(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; (i = find_pair(p, i, n, 'a', 'i', 1)) >= 0; i++) /* `ai` with `f` before, `l` after */
        if (i > 0 && i + 2 < n && lower(p[i - 1]) == 'f' && lower(p[i + 2]) == 'l') return 1;
    return 0;
}

/* `nccl info` or `rccl info` in any case */
static int names_ccl_info(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 1; (i = find_pair(p, i, n, 'c', 'c', 1)) >= 0; i++)
        if (i + 8 <= n && (lower(p[i - 1]) == 'n' || lower(p[i - 1]) == 'r') && lower_equal(p + i + 2, "l info", 6))
            return 1;
    return 0;
}

static int is_chatter(const unsigned char *p, Py_ssize_t n) {
    if (memchr(p, '\r', (size_t)n) != NULL) return 0;
    return names_ccl_info(p, n) && !holds_fail(p, n);
}

/* is_chatter for a line without `\r` whose `CCL INFO ` at `at` is known, but for `fail` (-1: the line names NCCL or
   RCCL there, `fail` not looked for here; else is_chatter's answer) */
static int names_chatter_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t at) {
    if (at < 1 || (lower(p[at - 1]) != 'n' && lower(p[at - 1]) != 'r')) return is_chatter(p, n);
    return -1;
}

static int occurrence_is_inert(const Needle *needle, const unsigned char *p, Py_ssize_t at, Py_ssize_t n,
                               int *chatter) {
    Py_ssize_t after = at + needle->length;
    switch (needle->rule) {
    case INERT_ALWAYS:
        return 1;
    case INERT_BEFORE_SUFFIX:
        return n - after >= needle->suffix_length && lower_equal(p + after, needle->suffix, needle->suffix_length);
    case INERT_UNLESS_ITERATION: /* the parser's test is case-sensitive: only the lowercase word can start a record */
        return memcmp(p + at, needle->text, (size_t)needle->length) != 0 || !iteration_record_follows(p, after, n);
    case INERT_IN_CHATTER:
        if (*chatter < 0) *chatter = is_chatter(p, n);
        return *chatter;
    default:
        return 0;
    }
}

static int live_needle_at(const Scanner *self, const unsigned char *p, Py_ssize_t i, Py_ssize_t n, int *chatter) {
    unsigned char first = lower(p[i]);
    for (Py_ssize_t k = self->first_start[first]; k < self->first_start[first + 1]; k++) {
        const Needle *needle = &self->needles[k];
        if (n - i >= needle->length && lower_equal(p + i, needle->text, needle->length) &&
            !occurrence_is_inert(needle, p, i, n, chatter))
            return 1;
    }
    return 0;
}

/* Case folding of the gram filters: OR 0x20 lowers every ASCII letter (and moves some other bytes: more hits,
   never fewer, as the needles are folded the same way). */
#define FOLD4 0x20202020U
static inline unsigned gram_hash(uint32_t gram) { return (unsigned)((gram * 0x9E3779B1U) >> 16); }
static inline int gram_in(const uint64_t *table, uint32_t gram) {
    unsigned h = gram_hash(gram);
    return (int)(table[h >> 6] >> (h & 63) & 1);
}

/* Whether the line parser must see the line p[0:n]: a needle occurrence that is not inert, or a control or
   non-ASCII byte (a tab is allowed, and `\r`: the line parser reads the segments between them as lines, and a
   needle in a segment is in the line). Most positions fail the two-byte filter of the needles' starts. */
static int needs_parser_bytewise(const Scanner *self, const unsigned char *p, Py_ssize_t from, Py_ssize_t n,
                                 int *chatter) {
    for (Py_ssize_t i = from; i < n; i++) {
        unsigned char ch = p[i];
        if ((ch < 0x20 && ch != '\t' && ch != '\r') || ch > 0x7e) return 1;
        if (self->has_short_needle || i + 1 == n) {
            if (live_needle_at(self, p, i, n, chatter)) return 1;
            continue;
        }
        unsigned pair = (unsigned)lower(ch) << 8 | lower(p[i + 1]);
        if ((self->pairs[pair >> 6] >> (pair & 63) & 1) && live_needle_at(self, p, i, n, chatter)) return 1;
    }
    return 0;
}

/* The same answer, every second position only: a needle of 5 bytes or more holds a 4-byte window starting at an even
   position (its own start or the next), one of 3 or 4 bytes starts at an even position or the next; so each even
   position tests one hashed 4-byte window and two 3-byte starts, and a hit is checked needle by needle. */
/* NCCL's own lines name themselves early: where `CCL INFO ` starts in the first bytes, or -1 */
static Py_ssize_t names_ccl_early(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; (i = find_pair(p, i, n, 'C', 'C', 0)) >= 0 && i + 9 <= n; i++)
        if (memcmp(p + i, "CCL INFO ", 9) == 0) return i;
    return -1;
}

/* Whether the chatter filter's window `gram` (case folded) at p[w] is where a needle live on chatter occurs. */
static int chatter_window_hit(const Scanner *self, const unsigned char *p, Py_ssize_t w, Py_ssize_t n, uint32_t gram) {
    int chatter = 1;
    Py_ssize_t low = 0, high = self->chatter_window_count; /* the windows are sorted: the first one >= gram */
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (self->chatter_windows[middle].gram < gram) low = middle + 1;
        else high = middle;
    }
    for (Py_ssize_t k = low; k < self->chatter_window_count && self->chatter_windows[k].gram == gram; k++) {
        const ChatterGram *window = &self->chatter_windows[k]; /* a needle holding that window, at its offset */
        if (window->offset > w) continue;
        Py_ssize_t start = w - window->offset;
        const Needle *needle = &self->needles[window->needle];
        if (n - start >= needle->length && lower_equal(p + start, needle->text, needle->length) &&
            !occurrence_is_inert(needle, p, start, n, &chatter))
            return 1;
    }
    return 0;
}

/* On NCCL/RCCL chatter (no `\r`, no `fail`): whether a needle live there occurs. Every second position: a needle of
   5 bytes or more holds its two chosen windows (`chatter_windows`) one at an even position. Four windows from two
   loads per step, their filter bits tested together. */
static int chatter_scan(const Scanner *self, const unsigned char *p, Py_ssize_t n) {
    const unsigned char *table = self->chatter_grams4;
    Py_ssize_t w = 0;
#if SWAR
    for (; w + 12 <= n; w += 8) {
        uint64_t x = load8((const char *)p + w) | ONES * 0x20, y = load8((const char *)p + w + 4) | ONES * 0x20;
        uint32_t grams[4] = {(uint32_t)x, (uint32_t)(x >> 16), (uint32_t)y, (uint32_t)(y >> 16)};
        if (!(table[gram_hash(grams[0])] | table[gram_hash(grams[1])] | table[gram_hash(grams[2])] |
              table[gram_hash(grams[3])]))
            continue;
        for (int k = 0; k < 4; k++)
            if (table[gram_hash(grams[k])] && chatter_window_hit(self, p, w + 2 * k, n, grams[k])) return 1;
    }
#endif
    for (; w + 4 <= n; w += 2) {
        uint32_t gram;
        memcpy(&gram, p + w, 4);
        gram |= FOLD4;
        if (table[gram_hash(gram)] && chatter_window_hit(self, p, w, n, gram)) return 1;
    }
    return 0;
}

/* Whether `fail` (any case) is at p[at - 1], knowing p[at:at + 2] may be `ai` */
static inline int fail_at_pair(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    return at > 0 && at + 2 < n && lower(p[at - 1]) == 'f' && lower(p[at]) == 'a' && lower(p[at + 1]) == 'i' &&
           lower(p[at + 2]) == 'l';
}

/* `known`: what the line pass found in the whole line (LINE_UNKNOWN: it did not pass over all of it) */
static int needs_parser(const Scanner *self, const unsigned char *p, Py_ssize_t n, int known) {
    int chatter = -1;
#if SWAR
    if (self->has_short_needle || self->has_pair_needle) return needs_parser_bytewise(self, p, 0, n, &chatter);
    Py_ssize_t i = 0;
    int has_cr = 0, has_fail = 0;
    if (known != LINE_UNKNOWN) {
        if (known & LINE_AI) has_fail = holds_fail(p, n);
        if (known & LINE_CONTROL) {
            for (Py_ssize_t k = 0; k < n; k++) {
                if ((p[k] < 0x20 && p[k] != '\t' && p[k] != '\r') || p[k] > 0x7e) return 1;
                has_cr |= p[k] == '\r';
            }
        }
        i = n; /* the pass below has nothing left to do */
    }
    /* one pass: control and non-ASCII bytes (tab and \r allowed), and `fail` (holds_fail's `ai` pairs, folded) */
    for (; i + 8 <= n; i += 8) { /* a byte below 0x20 or above 0x7e marks its high bit */
        uint64_t x = load8((const char *)p + i); /* and the next line's first byte or the newline: never `i` */
        if ((((x - ONES * 0x20) & ~x) | ((x + ONES * (127 - 0x7e)) | x)) & HIGHS) {
            for (int k = 0; k < 8; k++) {
                unsigned char ch = p[i + k];
                if ((ch < 0x20 && ch != '\t' && ch != '\r') || ch > 0x7e) return 1;
                has_cr |= ch == '\r';
            }
        }
        uint64_t pairs = ((x | ONES * 0x20) ^ (ONES * 'a')) |
                         ((load8((const char *)p + i + 1) | ONES * 0x20) ^ (ONES * 'i'));
        for (uint64_t marks = (pairs - ONES) & ~pairs & HIGHS; marks && !has_fail; marks &= marks - 1)
            has_fail = fail_at_pair(p, i + (__builtin_ctzll(marks) >> 3), n);
    }
    for (Py_ssize_t k = known == LINE_UNKNOWN ? i : n; k < n; k++) { /* the last bytes (control: bytewise below) */
        has_cr |= p[k] == '\r';
        has_fail |= fail_at_pair(p, k, n);
    }
    /* NCCL's own lines name themselves early: on them fewer needles can be live, a sparser filter */
    const uint64_t *grams = self->grams3;
    Py_ssize_t ccl_at = n > 24 && !has_cr ? names_ccl_early(p, n < 96 ? n : 96) : -1;
    if (ccl_at >= 0) {
        chatter = names_chatter_at(p, n, ccl_at);
        if (chatter < 0) chatter = !has_fail;
        if (chatter && self->chatter_stride2) /* every needle live there has 5 bytes or more: a stride of 2 */
            return chatter_scan(self, p, n);
        if (chatter) grams = self->chatter_grams3;
    }
    Py_ssize_t q = 0;
    for (; q + 8 <= n; q += 4) {
        uint64_t w = load8((const char *)p + q) | ((uint64_t)FOLD4 << 32 | FOLD4);
        for (int k = 0; k < 4; k++)
            if (gram_in(grams, (uint32_t)(w >> (8 * k)) & 0xFFFFFFU) && live_needle_at(self, p, q + k, n, &chatter))
                return 1;
    }
    /* the last bytes one by one */
    return needs_parser_bytewise(self, p, q, n, &chatter);
#else
    (void)known;
    return needs_parser_bytewise(self, p, 0, n, &chatter);
#endif
}

/* ---- loading and storing the summary's state -------------------------------------------------------------- */
static int load_optional_int(PyObject *owner, PyObject *name, long long *out, int *has) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL) return -1;
    int result = 0;
    *has = value != Py_None;
    *out = 0;
    if (*has) {
        if (!PyLong_CheckExact(value)) {
            PyErr_SetString(PyExc_TypeError, "an int was expected");
            result = -1;
        } else {
            *out = PyLong_AsLongLong(value);
            result = *out == -1 && PyErr_Occurred() ? -1 : 0;
        }
    }
    Py_DECREF(value);
    return result;
}

static int load_int(PyObject *owner, PyObject *name, long long *out) {
    int has;
    if (load_optional_int(owner, name, out, &has) < 0) return -1;
    if (!has) {
        PyErr_SetString(PyExc_TypeError, "an int was expected, not None");
        return -1;
    }
    return 0;
}

static int load_optional_float(PyObject *owner, PyObject *name, double *out, int *has) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL) return -1;
    int result = 0;
    *has = value != Py_None;
    *out = 0.0;
    if (*has) {
        if (!PyFloat_CheckExact(value)) {
            PyErr_SetString(PyExc_TypeError, "a float was expected");
            result = -1;
        } else {
            *out = PyFloat_AS_DOUBLE(value);
        }
    }
    Py_DECREF(value);
    return result;
}

static int load_float(PyObject *owner, PyObject *name, double *out) {
    int has;
    if (load_optional_float(owner, name, out, &has) < 0) return -1;
    if (!has) {
        PyErr_SetString(PyExc_TypeError, "a float was expected, not None");
        return -1;
    }
    return 0;
}

static void release_state(State *st) {
    Py_CLEAR(st->after);
    Py_CLEAR(st->reservoir);
    Py_CLEAR(st->tokens);
    Py_CLEAR(st->tflops);
    Py_CLEAR(st->random);
    Py_CLEAR(st->getrandbits);
}

static int load_running(const Scanner *self, State *st) {
    if (load_int(st->after, s_count, &st->count) < 0 || load_float(st->after, s_mean, &st->mean) < 0 ||
        load_float(st->after, s_m2, &st->m2) < 0 || load_float(st->after, s_minimum, &st->minimum) < 0 ||
        load_float(st->after, s_maximum, &st->maximum) < 0)
        return -1;
    st->next_replace = self->reservoir_size;
    if (st->count >= self->reservoir_size &&
        (load_int(st->after, s_next_replace, &st->next_replace) < 0 || load_float(st->after, s_weight, &st->weight) < 0))
        return -1;
    return 0;
}

static int load_state(const Scanner *self, PyObject *summary, State *st) {
    memset(st, 0, sizeof(*st));
    PyObject *head = PyObject_GetAttr(summary, s_head), *first_time;
    if (head == NULL) return -1;
    st->head_length = PyList_Check(head) ? PyList_GET_SIZE(head) : -1;
    Py_DECREF(head);
    if (st->head_length < 0) {
        PyErr_SetString(PyExc_TypeError, "the summary's head must be a list");
        return -1;
    }
    if ((first_time = PyObject_GetAttr(summary, s_first_time)) == NULL) return -1;
    st->needs_first_time = first_time == Py_None;
    Py_DECREF(first_time);
    PyObject *pending = PyObject_GetAttr(summary, s_save_pending);
    if (pending == NULL) return -1;
    st->save_pending = PyObject_IsTrue(pending);
    Py_DECREF(pending);
    if (st->save_pending < 0 ||
        load_optional_int(summary, s_max_counted, &st->max_counted, &st->has_max) < 0 ||
        load_int(summary, s_counted, &st->counted) < 0 || load_int(summary, s_logged, &st->logged) < 0 ||
        load_optional_int(summary, s_train_iters, &st->train_iters, &st->has_train_iters) < 0 ||
        load_optional_int(summary, s_first_iteration, &st->first_iteration, &st->has_first_iteration) < 0 ||
        load_optional_float(summary, s_first_loss, &st->first_loss, &st->has_first_loss) < 0 ||
        load_optional_float(summary, s_final_loss, &st->final_loss, &st->has_final_loss) < 0 ||
        load_optional_float(summary, s_min_loss, &st->min_loss, &st->has_min_loss) < 0 ||
        load_optional_int(summary, s_nan_iterations, &st->nan_total, &st->has_nan_total) < 0 ||
        load_optional_int(summary, s_skipped_iterations, &st->skipped_total, &st->has_skipped_total) < 0 ||
        load_int(summary, s_checkpoint_dropped, &st->checkpoint_dropped) < 0)
        return -1;
    if ((st->after = PyObject_GetAttr(summary, s_after_head)) == NULL ||
        (st->reservoir = PyObject_GetAttr(st->after, s_reservoir)) == NULL ||
        (st->tokens = PyObject_GetAttr(summary, s_tokens_after_head)) == NULL ||
        (st->tflops = PyObject_GetAttr(summary, s_tflops_after_head)) == NULL)
        return -1;
    if (!PyList_CheckExact(st->reservoir)) {
        PyErr_SetString(PyExc_TypeError, "the reservoir must be a list");
        return -1;
    }
    if (load_running(self, st) < 0 || load_int(st->tokens, s_count, &st->tokens_count) < 0 ||
        load_float(st->tokens, s_total, &st->tokens_total) < 0 || load_int(st->tflops, s_count, &st->tflops_count) < 0 ||
        load_float(st->tflops, s_total, &st->tflops_total) < 0 ||
        load_float(st->tokens, s_mean_weight, &st->tokens_weight) < 0 ||
        load_float(st->tflops, s_mean_weight, &st->tflops_weight) < 0)
        return -1;
    return 0;
}

static int store(PyObject *owner, PyObject *name, PyObject *value) {
    if (value == NULL) return -1;
    int result = PyObject_SetAttr(owner, name, value);
    Py_DECREF(value);
    return result;
}

static PyObject *optional_int(int has, long long value) {
    return has ? PyLong_FromLongLong(value) : Py_NewRef(Py_None);
}

static PyObject *optional_float(int has, double value) {
    return has ? PyFloat_FromDouble(value) : Py_NewRef(Py_None);
}

static int store_running(const Scanner *self, State *st) {
    PyObject *after = st->after;
    if (store(after, s_count, PyLong_FromLongLong(st->count)) < 0 ||
        store(after, s_mean, PyFloat_FromDouble(st->mean)) < 0 || store(after, s_m2, PyFloat_FromDouble(st->m2)) < 0 ||
        store(after, s_minimum, PyFloat_FromDouble(st->minimum)) < 0 ||
        store(after, s_maximum, PyFloat_FromDouble(st->maximum)) < 0)
        return -1;
    if (st->count >= self->reservoir_size && (store(after, s_next_replace, PyLong_FromLongLong(st->next_replace)) < 0 ||
                                              store(after, s_weight, PyFloat_FromDouble(st->weight)) < 0))
        return -1;
    return 0;
}

static int store_state(const Scanner *self, PyObject *summary, State *st) {
    if (store(summary, s_max_counted, optional_int(st->has_max, st->max_counted)) < 0 ||
        store(summary, s_counted, PyLong_FromLongLong(st->counted)) < 0 ||
        store(summary, s_logged, PyLong_FromLongLong(st->logged)) < 0 ||
        store(summary, s_train_iters, optional_int(st->has_train_iters, st->train_iters)) < 0 ||
        store(summary, s_first_iteration, optional_int(st->has_first_iteration, st->first_iteration)) < 0 ||
        store(summary, s_first_loss, optional_float(st->has_first_loss, st->first_loss)) < 0 ||
        store(summary, s_final_loss, optional_float(st->has_final_loss, st->final_loss)) < 0 ||
        store(summary, s_min_loss, optional_float(st->has_min_loss, st->min_loss)) < 0 ||
        store(summary, s_nan_iterations, optional_int(st->has_nan_total, st->nan_total)) < 0 ||
        store(summary, s_skipped_iterations, optional_int(st->has_skipped_total, st->skipped_total)) < 0 ||
        store(summary, s_save_pending, PyBool_FromLong(st->save_pending)) < 0 ||
        store(summary, s_checkpoint_dropped, PyLong_FromLongLong(st->checkpoint_dropped)) < 0 ||
        store_running(self, st) < 0 || store(st->tokens, s_count, PyLong_FromLongLong(st->tokens_count)) < 0 ||
        store(st->tokens, s_total, PyFloat_FromDouble(st->tokens_total)) < 0 ||
        store(st->tflops, s_count, PyLong_FromLongLong(st->tflops_count)) < 0 ||
        store(st->tflops, s_total, PyFloat_FromDouble(st->tflops_total)) < 0 ||
        store(st->tokens, s_mean_weight, PyFloat_FromDouble(st->tokens_weight)) < 0 ||
        store(st->tflops, s_mean_weight, PyFloat_FromDouble(st->tflops_weight)) < 0)
        return -1;
    return 0;
}

/* ---- one row into the summary: SummaryBuilder.add_rows, statement for statement ----------------------------- */
typedef struct {
    long long seq, world, default_gbs;
    int computes;
} Shape;

/* Whether C can take this row (else Python does): it fits the state's integers and needs nothing C does not do. */
static int row_fits(const Scanner *self, const State *st, const Row *row, int timed_prefix, const Shape *shape,
                    double *tokens, int *has_tokens) {
    long long sum, product;
    int counted = !st->has_max || row->iteration > st->max_counted;
    *has_tokens = 0;
    if (!counted) return 1;
    if (st->head_length < self->warmup_cap || (st->needs_first_time && timed_prefix)) return 0;
    if (__builtin_add_overflow(st->nan_total, row->nan, &sum) ||
        __builtin_add_overflow(st->skipped_total, row->skipped, &sum) ||
        __builtin_add_overflow(st->checkpoint_dropped, 1, &sum) || __builtin_add_overflow(st->count, 1, &sum))
        return 0;
    if (shape->computes) {
        long long gbs = row->gbs ? row->gbs : shape->default_gbs;
        if (gbs && shape->seq && shape->world && row->elapsed > 0) {
            if (__builtin_mul_overflow(gbs, shape->seq, &product) || product > MAX_EXACT_INT ||
                product < -MAX_EXACT_INT || shape->world > MAX_EXACT_INT || shape->world < -MAX_EXACT_INT)
                return 0;
            *tokens = (double)product / (row->elapsed / 1000.0 * (double)shape->world);
            *has_tokens = 1;
        }
    }
    return 1;
}

/* ---- the reservoir past RESERVOIR_SIZE: `_Running._reservoir_step`, with the same draws from the same generator -- */
/* The generator's `random` and `getrandbits`, fetched once per scan (no draw). */
static int fetch_generator(State *st) {
    if (st->random != NULL) return 0;
    PyObject *generator = PyObject_GetAttr(st->after, s_random);
    if (generator == NULL) return -1;
    st->random = PyObject_GetAttr(generator, s_random_method);
    st->getrandbits = st->random ? PyObject_GetAttr(generator, s_getrandbits) : NULL;
    Py_DECREF(generator);
    return st->getrandbits == NULL ? -1 : 0;
}

static int draw_random(State *st, double *out) {
    if (fetch_generator(st) < 0) return -1;
    PyObject *value = PyObject_CallNoArgs(st->random);
    if (value == NULL) return -1;
    *out = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* `_Running._below(n)`: getrandbits(n.bit_length()) until one is below n. */
static int draw_below(State *st, long long n, long long *out) {
    int bits = 0;
    for (long long rest = n; rest; rest >>= 1) bits++;
    if (fetch_generator(st) < 0) return -1;
    PyObject *bits_object = PyLong_FromLong(bits);
    if (bits_object == NULL) return -1;
    do {
        PyObject *value = PyObject_CallOneArg(st->getrandbits, bits_object);
        if (value == NULL) {
            Py_DECREF(bits_object);
            return -1;
        }
        *out = PyLong_AsLongLong(value);
        Py_DECREF(value);
        if (*out == -1 && PyErr_Occurred()) {
            Py_DECREF(bits_object);
            return -1;
        }
    } while (*out >= n);
    Py_DECREF(bits_object);
    return 0;
}

/* math.log(r) for a draw r, raising as math.log does for 0.0 */
static int log_of_draw(double r, double *out) {
    if (r <= 0.0) {
        PyErr_SetString(PyExc_ValueError, "math domain error");
        return -1;
    }
    *out = log(r);
    return 0;
}

/* `_Running._skip`: int(math.log(random() or 1e-300) / math.log(1 - weight)) + 1 */
static int draw_skip(State *st, long long *out) {
    double r, numerator, denominator = log(1.0 - st->weight), quotient;
    if (draw_random(st, &r) < 0 || log_of_draw(r != 0.0 ? r : 1e-300, &numerator) < 0) return -1;
    if (denominator == 0.0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "float division by zero");
        return -1;
    }
    quotient = numerator / denominator;
    if (!(quotient > -9.0e18 && quotient < 9.0e18)) {
        PyErr_SetString(PyExc_OverflowError, "reservoir skip out of range");
        return -1;
    }
    *out = (long long)quotient + 1;
    return 0;
}

/* Count `value` into the reservoir at a step due (the count is already st->count): fill the last slot and start
   Algorithm L, or replace a slot. The statistics other than the reservoir are already updated. */
static int reservoir_step(const Scanner *self, State *st, double value) {
    long long size = self->reservoir_size, skip, index;
    double r, logarithm;
    PyObject *number = PyFloat_FromDouble(value);
    if (number == NULL) return -1;
    if (st->count <= size) {
        int appended = PyList_Append(st->reservoir, number);
        Py_DECREF(number);
        if (appended < 0) return -1;
        if (st->count != size) return 0;
        if (draw_random(st, &r) < 0 || log_of_draw(r, &logarithm) < 0) return -1;
        st->weight = exp(logarithm / (double)size);
    } else if (st->count == st->next_replace) {
        if (draw_below(st, size, &index) < 0 || PyList_SetItem(st->reservoir, (Py_ssize_t)index, number) < 0)
            return -1; /* PyList_SetItem took the reference */
        if (draw_random(st, &r) < 0 || log_of_draw(r, &logarithm) < 0) return -1;
        st->weight *= exp(logarithm / (double)size);
    } else {
        Py_DECREF(number);
        return 0;
    }
    if (draw_skip(st, &skip) < 0) return -1;
    st->next_replace = st->count + skip;
    return 0;
}

/* 1 when counted, 0 when not, -1 on error. */
static int add_row(const Scanner *self, State *st, const Row *row, double tokens, int has_tokens) {
    st->logged++;
    if (st->has_max && row->iteration <= st->max_counted) return 0;
    st->max_counted = row->iteration;
    st->has_max = 1;
    st->counted++;
    if (!st->has_first_iteration) {
        st->first_iteration = row->iteration;
        st->has_first_iteration = 1;
    }
    if (row->train_iters) {
        st->train_iters = row->train_iters;
        st->has_train_iters = 1;
    }
    if (row->has_loss && row->loss_finite && !row->nan) {
        if (!st->has_first_loss) {
            st->first_loss = row->loss;
            st->has_first_loss = 1;
        }
        st->final_loss = row->loss;
        st->has_final_loss = 1;
        st->min_loss = st->has_min_loss && !(row->loss < st->min_loss) ? st->min_loss : row->loss;
        st->has_min_loss = 1;
    }
    st->nan_total += row->nan;
    st->has_nan_total = 1;
    st->skipped_total += row->skipped;
    st->has_skipped_total = 1;
    if (st->save_pending) {
        st->save_pending = 0;
        st->checkpoint_dropped++;
        return 1;
    }
    double x = row->elapsed, delta;
    st->count++;
    delta = x - st->mean;
    st->mean += delta / (double)st->count;
    st->m2 += delta * (x - st->mean);
    if (x < st->minimum) st->minimum = x;
    if (x > st->maximum) st->maximum = x;
    if (st->count < self->reservoir_size) {
        PyObject *number = PyFloat_FromDouble(x);
        if (number == NULL || PyList_Append(st->reservoir, number) < 0) {
            Py_XDECREF(number);
            return -1;
        }
        Py_DECREF(number);
    } else if (st->count >= st->next_replace && reservoir_step(self, st, x) < 0) { /* rare: O(k log(n/k)) steps */
        return -1;
    }
    if (has_tokens && isfinite(tokens)) {
        st->tokens_count++;
        st->tokens_total += tokens * x;
        st->tokens_weight += x;
    }
    if (row->has_tflops && isfinite(row->tflops)) {
        st->tflops_count++;
        st->tflops_total += row->tflops * x;
        st->tflops_weight += x;
    }
    return 1;
}

/* ---- the Scanner type ------------------------------------------------------------------------------------- */
static char *copy_bytes(PyObject *object, Py_ssize_t *length) {
    if (!PyBytes_Check(object)) {
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return NULL;
    }
    *length = PyBytes_GET_SIZE(object);
    char *copy = PyMem_Malloc((size_t)*length + 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(copy, PyBytes_AS_STRING(object), (size_t)*length + 1);
    return copy;
}

static int compare_needles(const void *a, const void *b) {
    const Needle *x = a, *y = b;
    return (int)(unsigned char)x->text[0] - (int)(unsigned char)y->text[0];
}

static int compare_windows(const void *a, const void *b) {
    uint32_t x = ((const ChatterGram *)a)->gram, y = ((const ChatterGram *)b)->gram;
    return (x > y) - (x < y);
}

static void Scanner_dealloc(Scanner *self) {
    for (Py_ssize_t k = 0; k < self->needle_count; k++) {
        PyMem_Free(self->needles[k].text);
        PyMem_Free(self->needles[k].suffix);
    }
    PyMem_Free(self->needles);
    PyMem_Free(self->chatter_windows);
    PyMem_Free(self->chatter_grams4);
    for (Py_ssize_t k = 0; k < self->key_count; k++) PyMem_Free(self->keys[k]);
    PyMem_Free(self->keys);
    PyMem_Free(self->key_lengths);
    PyMem_Free(self->times.items);
    PyMem_Free(self->counted.items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* How common a byte is in log text, roughly (a letter's English frequency; spaces and digits common, most punctuation
   rare): chatter windows are chosen where these are low, so that a window of a needle seldom occurs elsewhere. */
static int byte_commonness(unsigned char ch) {
    static const char LETTERS[] = "etaoinsrhldcumfpgwybvkxjqz"; /* most common first */
    ch = lower(ch);
    const char *found = ch ? strchr(LETTERS, ch) : NULL;
    if (found != NULL) return 26 - (int)(found - LETTERS);
    if (ch == ' ' || is_digit(ch)) return 24;
    if (ch == '.' || ch == ':' || ch == '/' || ch == '-' || ch == '_' || ch == ',' || ch == '[' || ch == ']') return 8;
    return 1;
}

/* The offset of the two adjacent 4-byte windows of a needle (5 bytes or more) that the chatter filter tests: the pair
   whose five bytes are least common. Only the filter's speed depends on it, never its answer. */
static int rarest_windows(const unsigned char *text, Py_ssize_t length) {
    int best = 0;
    long best_score = -1;
    for (int offset = 0; offset + 5 <= length; offset++) {
        long score = 1;
        for (int i = 0; i < 5; i++) score *= byte_commonness(text[offset + i]);
        if (best_score < 0 || score < best_score) {
            best = offset;
            best_score = score;
        }
    }
    return best;
}

/* Scanner(needles, keys, reservoir_size, warmup_cap): needles is a tuple of (lowercase bytes, inert rule, suffix). */
static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwargs) {
    PyObject *needles, *keys;
    static char *names[] = {"needles", "keys", "reservoir_size", "warmup_cap", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!LL", names, &PyTuple_Type, &needles, &PyTuple_Type, &keys,
                                     &self->reservoir_size, &self->warmup_cap))
        return -1;
    if (self->needles != NULL || self->keys != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner is initialised once");
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(needles);
    self->needles = PyMem_Calloc((size_t)count + 1, sizeof(Needle));
    if (self->needles == NULL) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *text, *suffix;
        Needle *needle = &self->needles[k];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(needles, k), "SiS", &text, &needle->rule, &suffix)) return -1;
        self->needle_count = k + 1;
        if ((needle->text = copy_bytes(text, &needle->length)) == NULL ||
            (needle->suffix = copy_bytes(suffix, &needle->suffix_length)) == NULL)
            return -1;
        if (needle->length == 0) {
            PyErr_SetString(PyExc_ValueError, "empty needle");
            return -1;
        }
    }
    qsort(self->needles, (size_t)count, sizeof(Needle), compare_needles);
    self->chatter_stride2 = 1;
    self->chatter_windows = PyMem_Calloc((size_t)count * 2 + 1, sizeof(ChatterGram));
    self->chatter_grams4 = PyMem_Calloc(65536, 1);
    if (self->chatter_windows == NULL || self->chatter_grams4 == NULL) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *text = (const unsigned char *)self->needles[k].text;
        if (self->needles[k].length < 2) {
            self->has_short_needle = 1;
            continue;
        }
        unsigned pair = (unsigned)text[0] << 8 | text[1];
        self->pairs[pair >> 6] |= (uint64_t)1 << (pair & 63);
        Py_ssize_t length = self->needles[k].length;
        if (self->needles[k].rule == INERT_ALWAYS) continue; /* never makes a line live: not in the gram filters */
        if (length == 2) {
            self->has_pair_needle = 1;
            continue;
        }
        uint32_t gram = (uint32_t)text[0] | (uint32_t)text[1] << 8 | (uint32_t)text[2] << 16;
        unsigned h = gram_hash(gram | (FOLD4 & 0xFFFFFFU));
        self->grams3[h >> 6] |= (uint64_t)1 << (h & 63);
        if (self->needles[k].rule != INERT_IN_CHATTER) {
            self->chatter_grams3[h >> 6] |= (uint64_t)1 << (h & 63);
            if (length < 5) {
                self->chatter_stride2 = 0;
                continue;
            }
            int offset = rarest_windows(text, length);
            for (int second = 0; second < 2; second++) {
                ChatterGram *window = &self->chatter_windows[self->chatter_window_count++];
                memcpy(&window->gram, text + offset + second, 4);
                window->gram |= FOLD4;
                window->offset = offset + second;
                window->needle = k;
                self->chatter_grams4[gram_hash(window->gram)] = 1;
            }
        }
    }
    qsort(self->chatter_windows, (size_t)self->chatter_window_count, sizeof(ChatterGram), compare_windows);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < count && (unsigned char)self->needles[k].text[0] < b) k++;
        self->first_start[b] = k;
    }
    self->key_count = PyTuple_GET_SIZE(keys);
    self->keys = PyMem_Calloc((size_t)self->key_count + 1, sizeof(char *));
    self->key_lengths = PyMem_Calloc((size_t)self->key_count + 1, sizeof(Py_ssize_t));
    if (self->keys == NULL || self->key_lengths == NULL) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < self->key_count; k++) {
        if ((self->keys[k] = copy_bytes(PyTuple_GET_ITEM(keys, k), &self->key_lengths[k])) == NULL) return -1;
        Py_ssize_t n = self->key_lengths[k];
        if (n >= 64 || n == 0) { /* never the whole key of a field the matcher takes: filter off, compare all */
            memset(self->key_lengths_by_first, 0xff, sizeof(self->key_lengths_by_first));
            continue;
        }
        self->key_lengths_by_first[(unsigned char)self->keys[k][0]] |= (uint64_t)1 << n;
    }
    return 0;
}

static int load_shape(PyObject *object, Shape *shape) {
    memset(shape, 0, sizeof(*shape));
    if (object == Py_None) return 0;
    shape->computes = 1;
    return PyArg_ParseTuple(object, "LLL", &shape->seq, &shape->world, &shape->default_gbs) ? 0 : -1;
}

static PyObject *stop(int kind, Py_ssize_t line_start, Py_ssize_t line_end, long long newlines, long long rows) {
    return Py_BuildValue("(innLL)", kind, line_start, line_end, newlines, rows);
}

/* ---- rows handed to a reader with a row hook (megapilot.logs.bulk.RowLine) ---------------------------------- */
static long long number_of(const unsigned char *p, int count) {
    long long value = 0;
    for (int i = 0; i < count; i++) value = value * 10 + (p[i] - '0');
    return value;
}

/* Days from 1970-01-01 to year-month-01 in the proleptic Gregorian calendar (date(y, m, 1).toordinal() - 719163). */
static long long days_to_month(long long year, long long month) {
    year -= month <= 2;
    long long era = (year >= 0 ? year : year - 399) / 400, year_of_era = year - era * 400;
    long long day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5;
    return era * 146097 + year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year - 719468;
}

/* prefix_time of the usual prefix ` [YYYY-MM-DD HH:MM:SS(.f{1,9})?] ` (spaces around optional): 1 with *out set,
   0 for any other prefix (Python reads it). The arithmetic of calendar.timegm and _timestamp_from_match: whole
   seconds as an integer, plus int(fraction) / 10**len(fraction), one correctly rounded division and sum. */
static int plain_prefix_time(const unsigned char *p, Py_ssize_t n, double *out) {
    Py_ssize_t i = 0, fraction_digits = 0;
    while (i < n && p[i] == ' ') i++;
    if (n - i < 21 || p[i] != '[' || !digits_at(p, i + 1, n, 4) || p[i + 5] != '-' || !digits_at(p, i + 6, n, 2) ||
        p[i + 8] != '-' || !digits_at(p, i + 9, n, 2) || p[i + 11] != ' ' || !digits_at(p, i + 12, n, 2) ||
        p[i + 14] != ':' || !digits_at(p, i + 15, n, 2) || p[i + 17] != ':' || !digits_at(p, i + 18, n, 2))
        return 0;
    const unsigned char *at = p + i + 1;
    Py_ssize_t j = i + 20;
    long long fraction = 0;
    if (j < n && p[j] == '.') {
        for (j++; j < n && is_digit(p[j]) && fraction_digits < 10; j++, fraction_digits++)
            fraction = fraction * 10 + (p[j] - '0');
        if (fraction_digits == 0 || fraction_digits > 9) return 0;
    }
    if (j >= n || p[j] != ']') return 0;
    for (j++; j < n && p[j] == ' '; j++) {
    }
    long long year = number_of(at, 4), month = number_of(at + 5, 2), day = number_of(at + 8, 2);
    if (j != n || year < 1 || month < 1 || month > 12 || day < 1 || day > 31) return 0;
    long long whole = (days_to_month(year, month) + day - 1) * 86400 + number_of(at + 11, 2) * 3600 +
                      number_of(at + 14, 2) * 60 + number_of(at + 17, 2);
    *out = fraction_digits ? (double)whole + (double)fraction / POWERS_OF_TEN[fraction_digits] : (double)whole;
    return 1;
}

static int lower_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t at, const char *word) {
    Py_ssize_t length = (Py_ssize_t)strlen(word);
    return at + length <= n && lower_equal(p + at, word, length);
}

/* Whether the fields after a row's loss leave its record's anomaly fields as the row's values (bulk.py
   `_DOUBT_WORDS`): no NaN/Inf, no float that overflows to one (a 3-digit exponent, 300 digits), no memory usage,
   no loss key that `lm_loss` reads before `loss`. A match is only a doubt: Python then builds the record. */
static int fields_are_plain(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = lower(p[i]);
        run = is_digit(ch) || ch == '_' ? run + 1 : 0;
        if (run >= 300) return 0;
        if ((ch == 'n' && lower_at(p, n, i, "nan")) || (ch == 'i' && lower_at(p, n, i, "inf")) ||
            (ch == 'm' && lower_at(p, n, i, "mem usage")) || (ch == 'l' && lower_at(p, n, i, "lm_loss")) ||
            (ch == 'r' && lower_at(p, n, i, "reduced_train_loss")))
            return 0;
        if (ch == 'e') {
            Py_ssize_t j = i + 1;
            if (j < n && (p[j] == '-' || p[j] == '+')) j++;
            if (j + 3 <= n && (is_digit(p[j]) || p[j] == '_') && (is_digit(p[j + 1]) || p[j + 1] == '_') &&
                (is_digit(p[j + 2]) || p[j + 2] == '_'))
                return 0;
        }
    }
    return 1;
}

/* What a reader with a row hook gets of a row folded in C: (line_start, prefix_end, line_end, newlines before it in
   this scan, iteration, loss (None if absent or not finite), plain (`fields_are_plain` and a finite or no loss),
   NaN count, time (prefix_time of the usual prefix, else None), 1 if that time was read here). */
static int hand_row(PyObject *rows_out, const char *base, Py_ssize_t line_start, const char *at, const char *newline,
                    long long newlines, const Row *row) {
    const unsigned char *ubase = (const unsigned char *)base;
    double time = 0.0;
    int timed = plain_prefix_time(ubase + line_start, at - base - line_start, &time);
    int plain = (!row->has_loss || row->loss_finite) &&
                fields_are_plain((const unsigned char *)row->fields_start, row->fields_end - row->fields_start);
    PyObject *loss = row->has_loss && row->loss_finite ? PyFloat_FromDouble(row->loss) : Py_NewRef(Py_None);
    if (loss == NULL) return -1;
    PyObject *time_s = timed ? PyFloat_FromDouble(time) : Py_NewRef(Py_None);
    if (time_s == NULL) {
        Py_DECREF(loss);
        return -1;
    }
    PyObject *item = Py_BuildValue("(nnnLLNiLNi)", line_start, (Py_ssize_t)(at - base), (Py_ssize_t)(newline - base),
                                   newlines, row->iteration, loss, plain, row->nan, time_s, timed);
    if (item == NULL) return -1;
    int failed = PyList_Append(rows_out, item);
    Py_DECREF(item);
    return failed;
}

/* Whether a span may hold a time (the shape test, a necessary condition of the Python reading): a prefix or a line
   with `\r` anywhere, another line at its start (`leading_time`). */
static int span_may_hold_time(const Span *span, const unsigned char *base) {
    const unsigned char *p = base + span->start;
    Py_ssize_t n = span->end - span->start;
    if (span->kind == TIME_PREFIX || (n > 0 && memchr(p, '\r', (size_t)n) != NULL)) return has_timestamp(p, n);
    return may_lead_with_time(p, n);
}

/* Spans are pushed untested; Python pops the latest first and reads them itself (a span it cannot read is passed
   over), so only the latest few need the shape test: from the end, spans failing it are dropped until TRIM_KEEP
   pass; the earlier ones stay, untested, for the rare case Python's reading refuses all of those. */
#define TRIM_KEEP 4
static void trim_spans(Spans *spans, const unsigned char *base) {
    Span keep[TRIM_KEEP];
    int kept = 0;
    Py_ssize_t i = spans->size;
    while (i > 0 && kept < TRIM_KEEP) {
        i--;
        if (span_may_hold_time(&spans->items[i], base)) keep[kept++] = spans->items[i];
    }
    for (int k = kept - 1; k >= 0; k--) spans->items[i++] = keep[k];
    spans->size = i;
}

static PyObject *scan_lines(Scanner *self, const char *base, Py_ssize_t start, Py_ssize_t end, PyObject *summary,
                            PyObject *shape_object, int awaits_step_line, PyObject *rows_out) {
    State st;
    Shape shape;
    memset(&st, 0, sizeof(st));
    self->times.size = self->counted.size = 0;
    if (load_shape(shape_object, &shape) < 0 || load_state(self, summary, &st) < 0) {
        release_state(&st);
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) && !PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear(); /* a state C cannot hold (an int past 64 bits): Python reads this source from now on */
        return stop(STOP_FALLBACK, start, start, 0, 0);
    }
    const unsigned char *ubase = (const unsigned char *)base;
    long long newlines = 0, rows = 0;
    Py_ssize_t pos = start;
    int kind = STOP_END;
    Py_ssize_t stop_start = end, stop_end = end;
    while (pos < end) {
        const char *line = base + pos, *newline = NULL;
        int flags = 0;
        const char *at = find_iteration_in_line(base, pos, end, &newline, &flags);
        Row row;
        int matched = 0;
        if (at != NULL && !awaits_step_line && prefix_ok(ubase + pos, at - line, !(flags & LINE_CONTROL))) {
            matched = match_iteration(self, at, base + end, &row, &newline);
            if (matched < 0) goto error;
        }
        if (newline == NULL) newline = memchr(at, '\n', (size_t)(base + end - at));
        Py_ssize_t length = newline - line;
        if (matched) {
            double tokens = 0.0;
            /* the prefix's shape is tested here only while it decides the row; else when the spans are trimmed */
            int has_tokens, timed = !st.needs_first_time || has_timestamp(ubase + pos, at - line);
            if (!row_fits(self, &st, &row, st.needs_first_time && timed, &shape, &tokens, &has_tokens))
                goto to_python;
            if (timed && spans_push(&self->times, pos, at - base, TIME_PREFIX) < 0) goto error;
            int counted = add_row(self, &st, &row, tokens, has_tokens);
            if (counted < 0) goto error;
            if (counted && timed && spans_push(&self->counted, pos, at - base, TIME_PREFIX) < 0) goto error;
            if (rows_out != NULL && hand_row(rows_out, base, pos, at, newline, newlines, &row) < 0) goto error;
            rows++;
        } else if (needs_parser(self, ubase + pos, length, at == NULL ? flags : LINE_UNKNOWN)) {
            goto to_python;
        } else if (spans_push(&self->times, pos, newline - base, TIME_LINE) < 0) { /* tested when trimmed */
            goto error;
        }
        newlines++;
        pos = newline - base + 1;
        continue;
    to_python:
        kind = STOP_LINE;
        stop_start = pos;
        stop_end = newline - base + 1;
        break;
    }
    if (store_state(self, summary, &st) < 0) goto error;
    release_state(&st);
    trim_spans(&self->times, ubase);
    trim_spans(&self->counted, ubase);
    return stop(kind, stop_start, stop_end, newlines, rows);
error:
    release_state(&st);
    return NULL;
}

/* scan(block, start, end, summary, shape, awaits_step_line[, rows_out]) -> (stop, line_start, line_end, newlines,
   rows); block is any contiguous bytes-like object (the reader's reused buffer), block[start:end] whole lines;
   rows_out, a list: each row folded is appended to it (`hand_row`). */
static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    Py_buffer block;
    PyObject *summary, *shape_object, *result, *rows_out = Py_None;
    Py_ssize_t start, end;
    int awaits_step_line;
    if (!PyArg_ParseTuple(args, "y*nnOOp|O", &block, &start, &end, &summary, &shape_object, &awaits_step_line,
                          &rows_out))
        return NULL;
    if (rows_out != Py_None && !PyList_Check(rows_out)) {
        PyBuffer_Release(&block);
        PyErr_SetString(PyExc_TypeError, "rows_out must be a list or None");
        return NULL;
    }
    const char *base = block.buf;
    if (start < 0 || end > block.len || start > end || (end > start && base[end - 1] != '\n')) {
        PyErr_SetString(PyExc_ValueError, "the range must be whole lines of the block");
        result = NULL;
    } else {
        result = scan_lines(self, base, start, end, summary, shape_object, awaits_step_line,
                            rows_out == Py_None ? NULL : rows_out);
    }
    PyBuffer_Release(&block);
    return result;
}

static PyObject *pop_span(Spans *spans, int with_kind) {
    if (spans->size == 0) Py_RETURN_NONE;
    Span *span = &spans->items[--spans->size];
    return with_kind ? Py_BuildValue("(inn)", span->kind, span->start, span->end)
                     : Py_BuildValue("(nn)", span->start, span->end);
}

static PyObject *Scanner_pop_time(Scanner *self, PyObject *Py_UNUSED(ignored)) { return pop_span(&self->times, 1); }

static PyObject *Scanner_pop_counted(Scanner *self, PyObject *Py_UNUSED(ignored)) {
    return pop_span(&self->counted, 0);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(block, start, end, summary, shape, awaits_step_line) -> (stop, line_start, line_end, newlines, rows)"},
    {"pop_time", (PyCFunction)Scanner_pop_time, METH_NOARGS,
     "The latest line or prefix of the last scan that may set the parser's time: (kind, start, end), or None."},
    {"pop_counted", (PyCFunction)Scanner_pop_counted, METH_NOARGS,
     "The latest counted row's prefix of the last scan that may hold a timestamp: (start, end), or None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "megapilot.logs._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scans blocks of log lines into a SummaryBuilder (see megapilot/logs/bulk.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
};

static int intern_names(void) {
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
    INTERN(s_max_counted, "_max_counted");
    INTERN(s_counted, "_counted");
    INTERN(s_logged, "_logged");
    INTERN(s_train_iters, "_train_iters");
    INTERN(s_first_iteration, "_first_iteration");
    INTERN(s_first_loss, "_first_loss");
    INTERN(s_final_loss, "_final_loss");
    INTERN(s_min_loss, "_min_loss");
    INTERN(s_nan_iterations, "_nan_iterations");
    INTERN(s_skipped_iterations, "_skipped_iterations");
    INTERN(s_save_pending, "_save_pending");
    INTERN(s_checkpoint_dropped, "_checkpoint_dropped");
    INTERN(s_head, "_head");
    INTERN(s_after_head, "_after_head");
    INTERN(s_tokens_after_head, "_tokens_after_head");
    INTERN(s_tflops_after_head, "_tflops_after_head");
    INTERN(s_first_time, "_first_time");
    INTERN(s_count, "count");
    INTERN(s_mean, "mean");
    INTERN(s_m2, "_m2");
    INTERN(s_minimum, "minimum");
    INTERN(s_maximum, "maximum");
    INTERN(s_reservoir, "_reservoir");
    INTERN(s_next_replace, "_next_replace");
    INTERN(s_total, "total");
    INTERN(s_random, "_random");
    INTERN(s_weight, "_weight");
    INTERN(s_mean_weight, "weight");
    INTERN(s_random_method, "random");
    INTERN(s_getrandbits, "getrandbits");
#undef INTERN
    return 0;
}

/* use_vectors(flag) -> whether the 32-byte line pass was in use: it is where the CPU has AVX2; tests turn it off to
   check the portable pass gives the same answers. Asking for it where it cannot run leaves it off. */
static PyObject *use_vectors(PyObject *Py_UNUSED(module), PyObject *flag) {
    int wanted = PyObject_IsTrue(flag), was = use_avx2_pass;
    if (wanted < 0) return NULL;
    use_avx2_pass = wanted && vectors_usable();
    return PyBool_FromLong(was);
}

static PyMethodDef scan_functions[] = {
    {"use_vectors", use_vectors, METH_O, "Turn the 32-byte line pass on or off; returns whether it was on."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "The compiled engine of summary-only log reading (megapilot/logs/bulk.py).", -1,
    scan_functions,
};

PyMODINIT_FUNC PyInit__scan(void) {
    if (intern_names() < 0 || PyType_Ready(&ScannerType) < 0) return NULL;
    use_avx2_pass = vectors_usable();
    PyObject *module = PyModule_Create(&scan_module);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "STOP_END", STOP_END) < 0 ||
        PyModule_AddIntConstant(module, "STOP_LINE", STOP_LINE) < 0 ||
        PyModule_AddIntConstant(module, "STOP_FALLBACK", STOP_FALLBACK) < 0 ||
        PyModule_AddIntConstant(module, "TIME_PREFIX", TIME_PREFIX) < 0 ||
        PyModule_AddIntConstant(module, "TIME_LINE", TIME_LINE) < 0 ||
        PyModule_AddIntConstant(module, "INERT_NEVER", INERT_NEVER) < 0 ||
        PyModule_AddIntConstant(module, "INERT_ALWAYS", INERT_ALWAYS) < 0 ||
        PyModule_AddIntConstant(module, "INERT_BEFORE_SUFFIX", INERT_BEFORE_SUFFIX) < 0 ||
        PyModule_AddIntConstant(module, "INERT_UNLESS_ITERATION", INERT_UNLESS_ITERATION) < 0 ||
        PyModule_AddIntConstant(module, "INERT_IN_CHATTER", INERT_IN_CHATTER) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(module, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
