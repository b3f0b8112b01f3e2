/* needle_trace: the native C step as a standalone program (no Python in the process).

   needle_trace IMAGE OUT

   IMAGE is a safetensors file holding everything the step reads (port/native_image.py writes
   it): the model's scalars ("s/NAME" int64 [1], "f/NAME" float32 [1]) and arrays (the NModel
   fields by name, per Engram site "tables/S", "eng_kv/S", "eng_taps/S"), the host's rows of
   every position of the schedule ("host/tok", "host/flat", "host/ok", "host/tap_ok",
   "host/valid"), the steps ("sched/steps" [S, 2]: first position, length), and the trace
   archive's manifest ("manifest", bytes of JSON with "@ARGMAX@" where the argmax goes).
   OUT is a trace archive (ladder/engine/archive.py): every registry point of every position, keyed
   "{step}/{point}", float32, leading axis the step's positions.

   The image is treated as hostile: a regular file of at most 4 GiB, a bounded header parse,
   every tensor's dtype, shape and byte range checked, every array's size checked against the
   scalars before the step reads it. Exit status: 0 written, 2 bad input (one line on stderr
   naming the tensor or field), 1 a failed step or write. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "captures.h"
#include "native.h"

int64_t nat_rows(const NModel *M, NState *S, int64_t m, int64_t pos0, const int64_t *tok,
                 const int64_t *flat, const float *ok, const uint8_t *tap_ok,
                 const uint8_t *valid, float *scratch, float **cap, int64_t want_logits,
                 float *logits);
int64_t nat_scratch_floats(const NModel *M, int64_t m);

#define MAX_FILE ((int64_t)4 << 30)
#define MAX_TENSORS 4096
#define MAX_DIM 8
#define MAX_NUM (1 << 24)

static void die(int code, const char *fmt, const char *a, long long b)
{
    fprintf(stderr, "needle_trace: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(code);
}

/* ---- the image: a safetensors header, parsed with a bounded scanner ---- */

typedef struct {
    char name[128], dtype[8];
    int64_t shape[MAX_DIM], ndim, lo, hi;
} Entry;

static const unsigned char *J, *JE;       /* header text being scanned */
static const unsigned char *image_base;  /* the file's first byte, for offsets in messages */
static Entry entries[MAX_TENSORS];
static int n_entries;

static void ws(void) { while (J < JE && (*J == ' ' || *J == '\n' || *J == '\r' || *J == '\t')) J++; }

static int expect(char c)
{
    ws();
    if (J < JE && *J == c) { J++; return 1; }
    return 0;
}

static void bad(const char *what)
{
    die(2, "image header: %s (byte %lld)", what, (long long)(J - image_base));
}

/* A JSON string into out (at most cap-1 bytes; escapes kept verbatim: names need none);
   out NULL: skipped, any length. */
static void str(char *out, size_t cap)
{
    size_t k = 0;
    if (!expect('"')) bad("a string was expected");
    while (J < JE && *J != '"') {
        if (*J == '\\') {
            if (++J >= JE) break;
        }
        if (out && k + 1 >= cap) bad("a string is too long");
        if (out) out[k++] = (char)*J;
        J++;
    }
    if (J >= JE) bad("an unterminated string");
    J++;
    if (out) out[k] = 0;
}

static int64_t num(void)
{
    int64_t v = 0;
    int digits = 0;
    ws();
    while (J < JE && *J >= '0' && *J <= '9') {
        if (++digits > 15) bad("an integer of more than 15 digits");
        v = v * 10 + (*J++ - '0');
    }
    if (!digits) bad("a non-negative integer was expected");
    return v;
}

static int64_t ints(int64_t *out, int64_t cap)
{
    int64_t k = 0;
    if (!expect('[')) bad("an array was expected");
    if (expect(']')) return 0;
    do {
        if (k >= cap) bad("an array is too long");
        out[k++] = num();
    } while (expect(','));
    if (!expect(']')) bad("an array is not closed");
    return k;
}

static void skip_value(int depth)
{
    ws();
    if (depth > 8) bad("nesting too deep");
    if (J < JE && *J == '"') { str(0, 0); return; }
    if (J < JE && (*J == '{' || *J == '[')) {
        char close = *J == '{' ? '}' : ']';
        int obj = *J == '{';
        J++;
        if (expect(close)) return;
        do {
            if (obj) { str(0, 0); if (!expect(':')) bad("':' expected"); }
            skip_value(depth + 1);
        } while (expect(','));
        if (!expect(close)) bad("a container is not closed");
        return;
    }
    while (J < JE && *J != ',' && *J != '}' && *J != ']') J++;
}

static int64_t file_size, data_start;
static unsigned char *image;

static int by_offset(const void *a, const void *b)
{
    int64_t x = entries[*(const int *)a].lo, y = entries[*(const int *)b].lo;
    return (x > y) - (x < y);
}

/* The tensors tile the data exactly, as safetensors writes them and bounded/safetensors.py
   demands: no gap, no overlap, no bytes after the last one. */
static void check_tiling(void)
{
    static int order[MAX_TENSORS];
    for (int i = 0; i < n_entries; i++) order[i] = i;
    qsort(order, (size_t)n_entries, sizeof order[0], by_offset);
    int64_t end = 0;
    for (int i = 0; i < n_entries; i++) {
        Entry *e = &entries[order[i]];
        if (e->lo != end)
            die(2, "image: tensor %s starts at data offset %lld, not where the previous one "
                "ends (tensors must tile the data)", e->name, (long long)e->lo);
        end = e->hi;
    }
    if (end != file_size - data_start)
        die(2, "image: %s%lld bytes follow the last tensor", "",
            (long long)(file_size - data_start - end));
}

static void parse_header(void)
{
    uint64_t hlen;
    if (file_size < 8) die(2, "image: %s%lld bytes, no header", "", (long long)file_size);
    memcpy(&hlen, image, 8);
    if (hlen > (uint64_t)(file_size - 8)) die(2, "image: header length %s%lld past the file", "",
                                             (long long)hlen);
    image_base = image;
    J = image + 8;
    JE = J + hlen;
    data_start = 8 + (int64_t)hlen;
    if (!expect('{')) bad("the header is not an object");
    if (expect('}')) return;
    do {
        char key[128];
        str(key, sizeof key);
        if (!expect(':')) bad("':' expected");
        if (!strcmp(key, "__metadata__")) { skip_value(0); continue; }
        if (n_entries >= MAX_TENSORS) bad("too many tensors");
        Entry *e = &entries[n_entries++];
        memset(e, 0, sizeof *e);
        strcpy(e->name, key);
        int seen = 0;
        if (!expect('{')) bad("a tensor entry is not an object");
        do {
            char field[32];
            str(field, sizeof field);
            if (!expect(':')) bad("':' expected");
            if (!strcmp(field, "dtype")) str(e->dtype, sizeof e->dtype), seen |= 1;
            else if (!strcmp(field, "shape")) e->ndim = ints(e->shape, MAX_DIM), seen |= 2;
            else if (!strcmp(field, "data_offsets")) {
                int64_t o[2];
                if (ints(o, 2) != 2) bad("data_offsets needs two integers");
                e->lo = o[0], e->hi = o[1], seen |= 4;
            } else skip_value(0);
        } while (expect(','));
        if (!expect('}') || seen != 7) bad("a tensor entry lacks dtype, shape or data_offsets");
        if (e->lo < 0 || e->lo > e->hi || e->hi > file_size - data_start)
            die(2, "image: tensor %s: data_offsets end %lld past the file (or out of order)",
                e->name, (long long)e->hi);
    } while (expect(','));
    if (!expect('}')) bad("the header object is not closed");
    check_tiling();
}

static int64_t elem_size(const char *dtype)
{
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "U8")) return 1;
    return 0;
}

/* The tensor `name`, of `dtype`, holding exactly `count` elements (-1: any); exits 2 else. */
static void *get(const char *name, const char *dtype, int64_t count, int64_t *got)
{
    for (int i = 0; i < n_entries; i++) {
        Entry *e = &entries[i];
        if (strcmp(e->name, name)) continue;
        if (strcmp(e->dtype, dtype)) die(2, "image: tensor %s has the wrong dtype (want %lld-byte "
                                         "elements)", name, (long long)elem_size(dtype));
        int64_t n = 1;
        for (int64_t k = 0; k < e->ndim; k++) {
            if (e->shape[k] > MAX_FILE) die(2, "image: tensor %s: dimension %lld too large",
                                            name, (long long)e->shape[k]);
            n *= e->shape[k];
            if (n > MAX_FILE) die(2, "image: tensor %s: %lld elements, too many", name,
                                  (long long)n);
        }
        if (n * elem_size(dtype) != e->hi - e->lo)
            die(2, "image: tensor %s: shape and data_offsets disagree (%lld bytes)", name,
                (long long)(e->hi - e->lo));
        if (count >= 0 && n != count)
            die(2, "image: tensor %s holds the wrong number of elements (%lld)", name,
                (long long)n);
        if (got) *got = n;
        return image + data_start + e->lo;
    }
    die(2, "image: no tensor %s%lld", name, 0);
    return 0;
}

static int64_t scalar(const char *name, int64_t lo, int64_t hi)
{
    char key[64];
    int64_t v;
    snprintf(key, sizeof key, "s/%s", name);
    memcpy(&v, get(key, "I64", 1, 0), 8);
    if (v < lo || v > hi) die(2, "image: scalar %s = %lld out of range", name, (long long)v);
    return v;
}

static float fscalar(const char *name)
{
    char key[64];
    float v;
    snprintf(key, sizeof key, "f/%s", name);
    memcpy(&v, get(key, "F32", 1, 0), 4);
    return v;
}

/* ---- the archive ---- */

typedef struct { char key[160]; int64_t dims[MAX_DIM], ndim; float *data; int64_t count; } Out;

static void jstring(FILE *f, const char *s, int64_t n)
{
    fputc('"', f);
    for (int64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fputc('\\', f), fputc(c, f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: needle_trace IMAGE OUT.safetensors\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode))
        die(2, "%s: not a readable regular file%lld", argv[1], 0);
    if (st.st_size > MAX_FILE) die(2, "%s: %lld bytes, past the 4 GiB limit", argv[1],
                                   (long long)st.st_size);
    file_size = st.st_size;
    image = malloc((size_t)file_size + 1);
    if (!image || fread(image, 1, (size_t)file_size, f) != (size_t)file_size)
        die(2, "%s: short read (%lld bytes expected)", argv[1], (long long)file_size);
    fclose(f);
    parse_header();

    NModel M;
    memset(&M, 0, sizeof M);
    M.L = scalar("L", 1, 99); M.n = scalar("n", 1, 64); M.d = scalar("d", 1, MAX_NUM);
    M.H = scalar("H", 1, 4096); M.KV = scalar("KV", 1, M.H); M.hd = scalar("hd", 2, 4096);
    M.hada = scalar("hada", 1, MAX_NUM); M.max_seq = scalar("max_seq", 1, MAX_NUM);
    M.vocab = scalar("vocab", 1, MAX_NUM); M.sinkhorn_iters = scalar("sinkhorn_iters", 1, 1000);
    M.sites = scalar("sites", 0, 64); M.T = scalar("T", 0, 4096); M.sub = scalar("sub", 0, MAX_NUM);
    M.taps = scalar("taps", 0, 64); M.dil = scalar("dil", 0, 4096); M.ering = scalar("ering", 0, MAX_NUM);
    M.eps = fscalar("eps"); M.attn_scale = fscalar("attn_scale"); M.walsh_scale = fscalar("walsh_scale");
    int64_t L = M.L, n = M.n, d = M.d, attn = M.H * M.hd, kvd = M.KV * M.hd;
    int64_t R = scalar("R", 1, M.max_seq), window = scalar("window", 0, R);
    M.emb = get("emb", "F32", M.vocab * d, 0);
    M.qkvg = get("qkvg", "F32", L * (2 * attn + 2 * kvd) * d, 0);
    M.out = get("out", "F32", L * d * attn, 0);
    M.router = get("router", "F32", L * (2 * n + n * n) * n * d, 0);
    M.qn = get("qn", "F32", L * M.hd, 0); M.kn = get("kn", "F32", L * M.hd, 0);
    M.pre = get("pre", "F32", L * d, 0); M.post = get("post", "F32", L * d, 0);
    M.pre_hada = get("pre_hada", "F32", L * d, 0); M.attn_gate = get("attn_gate", "F32", L, 0);
    M.d1 = get("d1", "F32", L * M.hada, 0); M.d2 = get("d2", "F32", L * M.hada, 0);
    M.d3 = get("d3", "F32", L * M.hada, 0);
    M.pre_bias = get("pre_bias", "F32", L * n, 0); M.post_bias = get("post_bias", "F32", L * n, 0);
    M.a_pre = get("a_pre", "F32", L, 0); M.a_post = get("a_post", "F32", L, 0);
    M.a_res = get("a_res", "F32", L, 0); M.b_res = get("b_res", "F32", L * n * n, 0);
    M.cos_t = get("cos_t", "F32", M.max_seq * (M.hd / 2), 0);
    M.sin_t = get("sin_t", "F32", M.max_seq * (M.hd / 2), 0);
    M.final_scale = get("final_scale", "F32", d, 0);
    const int64_t *site_of = get("site_of_layer", "I64", L, 0);
    for (int64_t i = 0; i < L; i++)
        if (site_of[i] < -1 || site_of[i] >= M.sites) die(2, "image: site_of_layer%s[%lld] out "
                                                           "of range", "", (long long)i);
    M.site_of_layer = site_of;
    const float *tables[64], *eng_kv[64], *eng_taps[64];
    int64_t table_rows[64];
    for (int64_t s = 0; s < M.sites; s++) {
        char key[32];
        int64_t cnt;
        snprintf(key, sizeof key, "tables/%lld", (long long)s);
        tables[s] = get(key, "F32", -1, &cnt);
        if (!M.sub || cnt % M.sub) die(2, "image: %s is not whole rows of sub (%lld)", key,
                                       (long long)M.sub);
        table_rows[s] = cnt / M.sub;
        snprintf(key, sizeof key, "eng_kv/%lld", (long long)s);
        eng_kv[s] = get(key, "F32", 2 * d * M.T * M.sub, 0);
        snprintf(key, sizeof key, "eng_taps/%lld", (long long)s);
        eng_taps[s] = get(key, "F32", M.taps * d, 0);
    }
    M.tables = tables; M.eng_kv = eng_kv; M.eng_taps = eng_taps;

    int64_t N;
    const int64_t *tok = get("host/tok", "I64", -1, &N);
    if (N < 1 || N > M.max_seq) die(2, "image: host/tok holds %s%lld positions", "", (long long)N);
    const int64_t *flat = get("host/flat", "I64", N * M.T, 0);
    const float *okv = get("host/ok", "F32", N * M.T, 0);
    const uint8_t *tap_ok = get("host/tap_ok", "U8", N * M.taps, 0);
    const uint8_t *valid = get("host/valid", "U8", N, 0);
    for (int64_t i = 0; i < N * M.T; i++)
        for (int64_t s = 0; s < M.sites; s++)
            if (flat[i] < 0 || flat[i] >= table_rows[s])
                die(2, "image: host/flat%s[%lld] is past a site's table rows", "", (long long)i);
    int64_t n_steps2;
    const int64_t *steps = get("sched/steps", "I64", -1, &n_steps2);
    int64_t S = n_steps2 / 2, at = 0;
    if (S < 1 || n_steps2 % 2) die(2, "image: sched/steps%s holds %lld values", "", (long long)n_steps2);
    for (int64_t k = 0; k < S; k++) {
        if (steps[2 * k] != at || steps[2 * k + 1] < 1 || at + steps[2 * k + 1] > N)
            die(2, "image: sched/steps%s: step %lld does not continue the schedule", "", (long long)k);
        at += steps[2 * k + 1];
    }
    if (at != N) die(2, "image: sched/steps cover %s%lld positions, not host/tok's", "", (long long)at);
    int64_t man_len;
    const char *manifest = get("manifest", "U8", -1, &man_len);

    /* the state, the scratch and one capture buffer per point, as the Python binding has */
    NState Sx = {0};
    Sx.R = R; Sx.window = window;
    Sx.k = calloc((size_t)(L * M.KV * R * M.hd), 4); Sx.v = calloc((size_t)(L * M.KV * R * M.hd), 4);
    Sx.key_ok = calloc((size_t)R, 1); Sx.lanes = calloc((size_t)(n * d), 4);
    Sx.hidden = calloc((size_t)d, 4); Sx.vraw = calloc((size_t)(M.sites * M.ering * d + 1), 4);
    float *scratch = calloc((size_t)nat_scratch_floats(&M, 1), 4);
    float *logits = calloc((size_t)M.vocab, 4);
    int64_t size[C_COUNT], rows[C_COUNT];
    int64_t dims[C_COUNT][2], nd[C_COUNT];
    for (int c = 0; c < C_COUNT; c++) {
        int64_t a = d, b = 0;
        switch (c) {
        case C_NX: a = n * d; break;
        case C_HPRE: case C_HPOST: a = n; break;
        case C_ALPHA: a = 0; break;
        case C_Q: a = M.H, b = M.hd; break;
        case C_K: case C_V: a = M.KV, b = M.hd; break;
        case C_ATTN: case C_GATE: a = attn; break;
        case C_RES: case C_HRES: a = n, b = n; break;
        case C_X: a = n, b = d; break;
        default: break;
        }
        nd[c] = a == 0 ? 0 : b == 0 ? 1 : 2;
        dims[c][0] = a; dims[c][1] = b;
        size[c] = a == 0 ? 1 : b == 0 ? a : a * b;
        rows[c] = (c == C_EK || c == C_EV) ? (M.sites ? M.sites : 1)
                : (c == C_MEAN || c == C_EMBED) ? 1 : L;
    }
    float *cap[C_COUNT];
    for (int c = 0; c < C_COUNT; c++) cap[c] = calloc((size_t)(rows[c] * size[c]), 4);

    /* every key of the archive in the registry's order (ladder/model/points.py), with its buffer */
    int64_t per_pos = 3 + 2 * M.sites + L * 21;
    Out *outs = calloc((size_t)(S * per_pos), sizeof(Out));
    int64_t n_out = 0, width, digits = 1;
    {   /* trace.schedule's names: decode{i} zero-padded to max(2, digits of n_decode - 1) */
        int64_t v = S - 2;
        if (v < 0) v = 0;
        while (v >= 10) v /= 10, digits++;
        width = digits > 2 ? digits : 2;
    }
    char (*step_names)[32] = calloc((size_t)S, 32);
    for (int64_t k = 0; k < S; k++) {
        if (k == 0) strcpy(step_names[k], "prefill");
        else snprintf(step_names[k], 32, "decode%0*lld", (int)width, (long long)(k - 1));
    }
#define ADD(stepk, fmt, arg, c, extra_dim)                                              \
    do {                                                                                \
        Out *o = &outs[n_out++];                                                        \
        char nm[96];                                                                    \
        snprintf(nm, sizeof nm, fmt, arg);                                              \
        snprintf(o->key, sizeof o->key, "%s/%s", step_names[stepk], nm);                \
        o->dims[0] = steps[2 * (stepk) + 1];                                            \
        o->ndim = 1;                                                                    \
        if ((extra_dim) >= 0) o->dims[o->ndim++] = (extra_dim);                         \
        else for (int64_t q = 0; q < nd[c]; q++) o->dims[o->ndim++] = dims[c][q];       \
        o->count = 1;                                                                   \
        for (int64_t q = 0; q < o->ndim; q++) o->count *= o->dims[q];                   \
        o->data = malloc((size_t)o->count * 4);                                          \
    } while (0)
    static const int layer_caps[] = {C_NX, C_HPRE, C_U, C_ALPHA, C_BX, C_H, C_Q, C_K, C_V,
                                     C_ATTN, C_GATE, C_AOUT, C_APOST, C_MI, C_MO, C_BLOCK, C_Y,
                                     C_HPOST, C_RES, C_HRES, C_X};
    int64_t *first_out = calloc((size_t)S, sizeof(int64_t));
    for (int64_t k = 0; k < S; k++) {
        first_out[k] = n_out;
        ADD(k, "%s", "embed", C_EMBED, -1);
        for (int64_t s = 0; s < M.sites; s++) {
            ADD(k, "engram_k%lld", (long long)s, C_EK, -1);
            ADD(k, "engram_v%lld", (long long)s, C_EV, -1);
        }
        for (int64_t i = 0; i < L; i++)
            for (size_t j = 0; j < sizeof layer_caps / sizeof *layer_caps; j++) {
                int c = layer_caps[j];
                if (c == C_ALPHA && site_of[i] < 0) continue;
                char pname[64];
                snprintf(pname, sizeof pname, "L%02lld.%s", (long long)i, capture_names[c]);
                ADD(k, "%s", pname, c, -1);
            }
        ADD(k, "%s", "lane_mean", C_MEAN, -1);
        ADD(k, "%s", "final_norm", C_MEAN, d);
        ADD(k, "%s", "logits", C_MEAN, M.vocab);
    }

    /* the run: one position at a time, as the ladder traces a port */
    int64_t *argmax = calloc((size_t)S, sizeof(int64_t));
    for (int64_t k = 0; k < S; k++) {
        for (int64_t j = 0; j < steps[2 * k + 1]; j++) {
            int64_t p = steps[2 * k] + j;
            if (nat_rows(&M, &Sx, 1, p, tok + p, flat + p * M.T, okv + p * M.T,
                         tap_ok + p * M.taps, valid + p, scratch, cap, 1, logits) != 0)
                die(1, "step at position %s%lld refused", "", (long long)p);
            int64_t o = first_out[k];
#define PUT(src, cnt) do { memcpy(outs[o].data + j * (cnt), (src), (size_t)(cnt) * 4); o++; } while (0)
            PUT(cap[C_EMBED], size[C_EMBED]);
            for (int64_t s = 0; s < M.sites; s++) {
                PUT(cap[C_EK] + s * d, d);
                PUT(cap[C_EV] + s * d, d);
            }
            for (int64_t i = 0; i < L; i++)
                for (size_t q = 0; q < sizeof layer_caps / sizeof *layer_caps; q++) {
                    int c = layer_caps[q];
                    if (c == C_ALPHA && site_of[i] < 0) continue;
                    PUT(cap[c] + i * size[c], size[c]);
                }
            PUT(cap[C_MEAN], d);
            PUT(Sx.hidden, d);
            PUT(logits, M.vocab);
#undef PUT
        }
        int64_t best = 0;
        for (int64_t t = 1; t < M.vocab; t++) if (logits[t] > logits[best]) best = t;
        argmax[k] = best;
    }

    /* the manifest with the argmax filled in, then the safetensors framing */
    const char *mark = "\"@ARGMAX@\"";
    const char *hit = 0;
    for (int64_t i = 0; i + 10 <= man_len; i++)
        if (!memcmp(manifest + i, mark, 10)) { hit = manifest + i; break; }
    if (!hit) die(2, "image: the manifest has no %s placeholder%lld", mark, 0);
    size_t cap_m = (size_t)man_len + (size_t)S * 64 + 16;
    char *man = malloc(cap_m);
    size_t ml = (size_t)(hit - manifest);
    memcpy(man, manifest, ml);
    ml += (size_t)snprintf(man + ml, cap_m - ml, "{");
    for (int64_t k = 0; k < S; k++)
        ml += (size_t)snprintf(man + ml, cap_m - ml, "%s\"%s\": %lld", k ? ", " : "",
                               step_names[k], (long long)argmax[k]);
    ml += (size_t)snprintf(man + ml, cap_m - ml, "}");
    size_t rest = (size_t)(man_len - (hit + 10 - manifest));
    memcpy(man + ml, hit + 10, rest);
    ml += rest;

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]) >= (int)sizeof tmp)
        die(2, "output path too long%s%lld", "", 0);
    FILE *hf = tmpfile();
    if (!hf) die(1, "cannot make a temporary file%s%lld", "", 0);
    fprintf(hf, "{\"__metadata__\":{\"needle_parity_trace\":");
    jstring(hf, man, (int64_t)ml);
    fprintf(hf, "}");
    int64_t off = 0;
    for (int64_t i = 0; i < n_out; i++) {
        fprintf(hf, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", outs[i].key);
        for (int64_t q = 0; q < outs[i].ndim; q++)
            fprintf(hf, "%s%lld", q ? "," : "", (long long)outs[i].dims[q]);
        fprintf(hf, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                (long long)(off + outs[i].count * 4));
        off += outs[i].count * 4;
    }
    fprintf(hf, "}");
    long hl = ftell(hf);
    uint64_t padded = (uint64_t)((hl + 7) / 8 * 8);
    char *head = malloc(padded);
    rewind(hf);
    if (fread(head, 1, (size_t)hl, hf) != (size_t)hl) die(1, "temporary file%s%lld", "", 0);
    fclose(hf);
    memset(head + hl, ' ', padded - (uint64_t)hl);
    FILE *of = fopen(tmp, "wb");
    if (!of) die(1, "%s: cannot write (errno %lld)", tmp, (long long)errno);
    int okw = fwrite(&padded, 8, 1, of) == 1 && fwrite(head, 1, padded, of) == padded;
    for (int64_t i = 0; i < n_out && okw; i++)
        okw = fwrite(outs[i].data, 4, (size_t)outs[i].count, of) == (size_t)outs[i].count;
    if (fclose(of) || !okw) { remove(tmp); die(1, "%s: write failed%lld", tmp, 0); }
    if (rename(tmp, argv[2])) { remove(tmp); die(1, "%s: cannot rename into place%lld", argv[2], 0); }
    printf("needle_trace: %lld positions, %lld steps, %lld values written to %s\n",
           (long long)N, (long long)S, (long long)n_out, argv[2]);
    return 0;
}
