/*
 * The plugin registry and backend selection through the public API (links the shared
 * libflashport, as an application would).
 *
 * Plugins come from tests/plugins/test_plugin.c (built as MODULE libraries into the folder that
 * FLASHPORT_PLUGIN_PATH names) plus files this test writes into a temporary folder placed first
 * on the path: libflashport_testbroken.so (not a shared library), libflashport_noentry.so (a real
 * shared library without the entry symbol: a copy of libflashport itself) and, outside the search
 * path, a link to the working testdev plugin that a name like "a/../../evil/libflashport_testdev"
 * would reach if names could walk the file system.
 *
 * Checked: loading routes calls to the plugin (its forward's result, not attention, comes back
 * through flashport_attention_forward; memory helpers and set_stream go through it too); the
 * version check (entry refuses, or ops stamped with another version) and a broken file give
 * BACKEND_UNAVAILABLE with a message naming the versions / the loader's error; a plugin without
 * a device gives NO_DEVICE listing the available backends; FLASHPORT_BACKEND selection; names
 * with '/' or '..' are unknown, not paths. Logging runs in child processes (FLASHPORT_LOG is read
 * once per process): with FLASHPORT_LOG=1 every stderr line is a "[flashport] " log line and the
 * backend, plugin and auto choices appear; with it unset or "0" the library prints nothing.
 */
#include "core/backend.h"
#include "tests/test_util.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char plugin_dir[2048]; /* the built test plugins */
static char tmp_root[64];     /* mkdtemp */
static char search_dir[128];  /* tmp_root/search: first on FLASHPORT_PLUGIN_PATH */
static char broken_path[192], noentry_path[192], evil_dir[128], evil_link[192], walk_dir[192];
static char plugin_path_value[4096]; /* FLASHPORT_PLUGIN_PATH for this process and children */

static int contains(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

#define CHECK_OPEN(name, want, needle)                                                             \
    do {                                                                                           \
        flashport_backend *be_ = (flashport_backend *)&be_;                                        \
        flashport_status st_ = flashport_backend_open(name, &be_);                                 \
        const char *m_ = flashport_last_error();                                                   \
        CHECK_MSG(st_ == (want), "open(%s): got %s (\"%s\"), expected %s", #name,                  \
                  flashport_status_string(st_), m_, flashport_status_string(want));                \
        CHECK_MSG(contains(m_, needle), "open(%s): message \"%s\" lacks \"%s\"", #name, m_,        \
                  needle);                                                                         \
        if (st_ == FLASHPORT_OK)                                                                   \
            flashport_backend_close(be_);                                                          \
        else                                                                                       \
            CHECK_MSG(be_ == NULL, "open(%s): *out not reset on failure", #name);                  \
    } while (0)

/* ---- set-up: the temporary plugin folder --------------------------------------------------- */

static int setup(void)
{
    const char *env = getenv("FLASHPORT_PLUGIN_PATH");
    snprintf(plugin_dir, sizeof plugin_dir, "%s", env && *env ? env : FLASHPORT_TEST_PLUGIN_DIR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/flashport_test_plugins_XXXXXX");
    if (!mkdtemp(tmp_root))
        return -1;
    snprintf(search_dir, sizeof search_dir, "%s/search", tmp_root);
    snprintf(evil_dir, sizeof evil_dir, "%s/evil", tmp_root);
    snprintf(walk_dir, sizeof walk_dir, "%s/libflashport_a", search_dir);
    snprintf(broken_path, sizeof broken_path, "%s/libflashport_testbroken.so", search_dir);
    snprintf(noentry_path, sizeof noentry_path, "%s/libflashport_noentry.so", search_dir);
    snprintf(evil_link, sizeof evil_link, "%s/libflashport_testdev.so", evil_dir);
    if (mkdir(search_dir, 0700) || mkdir(evil_dir, 0700) || mkdir(walk_dir, 0700))
        return -1;
    FILE *f = fopen(broken_path, "wb");
    if (!f)
        return -1;
    for (int i = 0; i < 64; i++)
        fputs("this is not an ELF shared object. ", f);
    fclose(f);
    Dl_info info;
    if (!dladdr((void *)&flashport_version, &info) || !info.dli_fname ||
        tu_copy_file(info.dli_fname, noentry_path) != 0)
        return -1;
    char target[2200];
    snprintf(target, sizeof target, "%s/libflashport_testdev.so", plugin_dir);
    if (symlink(target, evil_link) != 0)
        return -1;
    /* an empty entry and a trailing colon must be harmless */
    snprintf(plugin_path_value, sizeof plugin_path_value, "%s::%s:", search_dir, plugin_dir);
    return setenv("FLASHPORT_PLUGIN_PATH", plugin_path_value, 1);
}

static void teardown(void)
{
    unlink(broken_path);
    unlink(noentry_path);
    unlink(evil_link);
    rmdir(walk_dir);
    rmdir(search_dir);
    rmdir(evil_dir);
    rmdir(tmp_root);
}

/* ---- routing ------------------------------------------------------------------------------- */

enum { RB = 2, RNQ = 3, RNK = 4, RH = 4, RHKV = 2, RD = 8 };

/* Small integers, exact in f16, so the plugin's q + v must match bit for bit. */
static void fill_ints(float *x, int64_t n, tu_rng *r)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((int)(tu_rng_u32(r) % 9) - 4);
}

/* Runs the forward on `name` with every buffer from its memory helpers; o: (B, Nq, H, D),
 * lse: (B, H, Nq). */
static flashport_status forward_on(const char *name, const float *q, const float *k, const float *v,
                                   float *o, float *lse)
{
    flashport_backend *be;
    flashport_status st = flashport_backend_open(name, &be);
    if (st != FLASHPORT_OK)
        return st;
    const int64_t nq = RB * RNQ * RH * RD, nk = RB * RNK * RHKV * RD, nl = RB * RH * RNQ;
    const flashport_dtype dt = FLASHPORT_F16;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dob = NULL, *dl = NULL;
    uint16_t hq[RB * RNQ * RH * RD], hk[RB * RNK * RHKV * RD], hv[RB * RNK * RHKV * RD];
    uint16_t ho[RB * RNQ * RH * RD];
    tu_from_f32(q, nq, dt, hq);
    tu_from_f32(k, nk, dt, hk);
    tu_from_f32(v, nk, dt, hv);
    if ((st = flashport_malloc(be, sizeof hq, &dq)) ||
        (st = flashport_malloc(be, sizeof hk, &dk)) ||
        (st = flashport_malloc(be, sizeof hv, &dv)) ||
        (st = flashport_malloc(be, sizeof ho, &dob)) ||
        (st = flashport_malloc(be, (size_t)nl * 4, &dl)) ||
        (st = flashport_memcpy_to_device(be, dq, hq, sizeof hq)) ||
        (st = flashport_memcpy_to_device(be, dk, hk, sizeof hk)) ||
        (st = flashport_memcpy_to_device(be, dv, hv, sizeof hv)))
        goto done;
    const int64_t qs[4] = {RB, RNQ, RH, RD}, ks[4] = {RB, RNK, RHKV, RD}, ls[3] = {RB, RH, RNQ};
    flashport_tensor tq = flashport_tensor_contiguous(dq, dt, 4, qs);
    flashport_tensor tk = flashport_tensor_contiguous(dk, dt, 4, ks);
    flashport_tensor tv = flashport_tensor_contiguous(dv, dt, 4, ks);
    flashport_tensor to = flashport_tensor_contiguous(dob, dt, 4, qs);
    flashport_tensor tl = flashport_tensor_contiguous(dl, FLASHPORT_F32, 3, ls);
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    if ((st = flashport_attention_forward(be, &p, &tq, &tk, &tv, &to, &tl)) ||
        (st = flashport_synchronize(be)) ||
        (st = flashport_memcpy_to_host(be, ho, dob, sizeof ho)) ||
        (st = flashport_memcpy_to_host(be, lse, dl, (size_t)nl * 4)))
        goto done;
    tu_to_f32(ho, nq, dt, o);
done:
    flashport_free(be, dq);
    flashport_free(be, dk);
    flashport_free(be, dv);
    flashport_free(be, dob);
    flashport_free(be, dl);
    flashport_backend_close(be);
    return st;
}

static void test_routing(void)
{
    static float q[RB * RNQ * RH * RD], k[RB * RNK * RHKV * RD], v[RB * RNK * RHKV * RD];
    static float o[RB * RNQ * RH * RD], lse[RB * RH * RNQ], o_cpu[RB * RNQ * RH * RD],
        lse_cpu[RB * RH * RNQ];
    tu_rng r = tu_rng_seed(5);
    fill_ints(q, RB * RNQ * RH * RD, &r);
    fill_ints(k, RB * RNK * RHKV * RD, &r);
    fill_ints(v, RB * RNK * RHKV * RD, &r);
    flashport_status st = forward_on("testdev", q, k, v, o, lse);
    if (!CHECK_MSG(st == FLASHPORT_OK, "forward through testdev: %s (%s)",
                   flashport_status_string(st), flashport_last_error()))
        return;
    int64_t bad = 0;
    for (int b = 0; b < RB; b++)
        for (int i = 0; i < RNQ; i++)
            for (int h = 0; h < RH; h++) {
                for (int d = 0; d < RD; d++) {
                    float want = q[((b * RNQ + i) * RH + h) * RD + d] +
                                 v[((b * RNK + 0) * RHKV + h / (RH / RHKV)) * RD + d];
                    bad += o[((b * RNQ + i) * RH + h) * RD + d] != want;
                }
                bad += lse[(b * RH + h) * RNQ + i] != 1000.0f + (float)i;
            }
    CHECK_MSG(bad == 0, "testdev: %lld values are not the plugin's q + v / 1000 + i",
              (long long)bad);
    /* The same call on cpu computes attention: if it matched, the check above proved nothing. */
    st = forward_on("cpu", q, k, v, o_cpu, lse_cpu);
    if (CHECK_MSG(st == FLASHPORT_OK, "forward on cpu: %s", flashport_last_error())) {
        int64_t same = 0;
        for (int i = 0; i < RB * RNQ * RH * RD; i++)
            same += o_cpu[i] == o[i];
        CHECK_MSG(same < RB * RNQ * RH * RD / 2, "cpu and testdev agree on %lld of %d values",
                  (long long)same, RB * RNQ * RH * RD);
    }

    flashport_backend *be;
    if (CHECK(flashport_backend_open_device("testdev", 5, &be) == FLASHPORT_OK)) {
        CHECK(strcmp(flashport_backend_name(be), "testdev") == 0);
        CHECK(flashport_backend_device(be) == 5);
        CHECK(flashport_set_stream(be, NULL) == FLASHPORT_OK);
        char dummy;
        CHECK(flashport_set_stream(be, &dummy) == FLASHPORT_ERR_DEVICE &&
              contains(flashport_last_error(), "testdev: ") &&
              contains(flashport_last_error(), "is not a stream of this device"));
        flashport_backend *be2;
        if (CHECK(flashport_backend_open("testdev", &be2) == FLASHPORT_OK))
            flashport_backend_close(be2);
        flashport_backend_close(be);
    }
}

/* ---- failures of loading ------------------------------------------------------------------- */

static void test_load_failures(void)
{
    char want[512];
    for (int round = 0; round < 2; round++) { /* a failed load is not cached as a success */
        snprintf(want, sizeof want, "testoldapi was built for plugin API %d but the core has %d",
                 FP_PLUGIN_API_VERSION + 1, FP_PLUGIN_API_VERSION);
        CHECK_OPEN("testoldapi", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
        CHECK_OPEN("testoldapi", FLASHPORT_ERR_BACKEND_UNAVAILABLE, "refused to register");
        snprintf(want, sizeof want, "API version %d, core expects %d", FP_PLUGIN_API_VERSION + 7,
                 FP_PLUGIN_API_VERSION);
        CHECK_OPEN("testbadver", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
    }
    /* The loader's own words for the broken file. */
    void *h = dlopen(broken_path, RTLD_NOW | RTLD_LOCAL);
    const char *loader = h ? "(it loaded!)" : dlerror();
    if (h)
        dlclose(h);
    snprintf(want, sizeof want, "cannot load %s: %s", broken_path, loader ? loader : "");
    CHECK_OPEN("testbroken", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
    snprintf(want, sizeof want, "%s does not export %s", noentry_path, FP_PLUGIN_ENTRY_SYMBOL);
    CHECK_OPEN("noentry", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);

    char avail[256], list[300];
    CHECK(flashport_available_backends(avail, sizeof avail, NULL) == FLASHPORT_OK);
    CHECK_MSG(strncmp(avail, "cpu, reference", 14) == 0, "available backends: \"%s\"", avail);
    snprintf(list, sizeof list, "available backends: %s", avail);
    CHECK_OPEN("testnodev", FLASHPORT_ERR_NO_DEVICE, "testnodev: no test device 0 present");
    CHECK_OPEN("testnodev", FLASHPORT_ERR_NO_DEVICE, list);
    CHECK_OPEN("testbroken", FLASHPORT_ERR_BACKEND_UNAVAILABLE, list);
    CHECK_OPEN("nonexistent", FLASHPORT_ERR_BACKEND_UNKNOWN, list);
    CHECK_OPEN("nonexistent", FLASHPORT_ERR_BACKEND_UNKNOWN, "unknown backend 'nonexistent'");
}

static void test_available_list(void)
{
    char buf[64];
    size_t need = 0, need2 = 0;
    memset(buf, 'x', sizeof buf);
    /* A size query, then short buffers: whole names only, and the size the list needs. */
    CHECK(flashport_available_backends(NULL, 0, &need) == FLASHPORT_ERR_BUFFER_TOO_SMALL);
    CHECK_MSG(need > 4 && need <= sizeof buf, "needed %zu", need);
    CHECK(flashport_available_backends(buf, 0, &need2) == FLASHPORT_ERR_BUFFER_TOO_SMALL &&
          buf[0] == 'x' && need2 == need);
    CHECK(flashport_available_backends(buf, 4, &need2) == FLASHPORT_ERR_BUFFER_TOO_SMALL &&
          strcmp(buf, "cpu") == 0 && need2 == need);
    CHECK(contains(flashport_last_error(), "needs"));
    CHECK(flashport_available_backends(buf, 3, NULL) == FLASHPORT_ERR_BUFFER_TOO_SMALL &&
          buf[0] == '\0');
    CHECK(flashport_available_backends(buf, need - 1, NULL) == FLASHPORT_ERR_BUFFER_TOO_SMALL);
    CHECK(flashport_available_backends(buf, need, &need2) == FLASHPORT_OK && need2 == need &&
          strlen(buf) + 1 == need);
    CHECK(flashport_available_backends(buf, sizeof buf, NULL) == FLASHPORT_OK);
    CHECK_MSG(contains(buf, "cpu") && contains(buf, "reference") && !contains(buf, "test"),
              "available backends: \"%s\"", buf);
}

/* ---- names and FLASHPORT_BACKEND ----------------------------------------------------------- */

static void test_names(void)
{
    /* The walk below would reach a working plugin if names were used as paths. */
    char walked[512];
    snprintf(walked, sizeof walked, "%s/libflashport_a/../../evil/libflashport_testdev.so",
             search_dir);
    CHECK_MSG(access(walked, R_OK) == 0, "set-up: %s is not reachable, the check is void", walked);
    CHECK_OPEN("a/../../evil/libflashport_testdev", FLASHPORT_ERR_BACKEND_UNKNOWN,
               "is not a backend name");
    CHECK_OPEN("../testdev", FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");
    CHECK_OPEN("..", FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");
    CHECK_OPEN("test/dev", FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");
    CHECK_OPEN("TESTDEV", FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");
    CHECK_OPEN("", FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");
    CHECK_OPEN("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", FLASHPORT_ERR_BACKEND_UNKNOWN,
               "is not a backend name");
}

/* Opens `name` (NULL: FLASHPORT_BACKEND) and returns the backend's name, "" on failure. */
static const char *opened_name(const char *name, flashport_status *st)
{
    static char got[64];
    flashport_backend *be = NULL;
    got[0] = '\0';
    *st = flashport_backend_open(name, &be);
    if (*st == FLASHPORT_OK) {
        snprintf(got, sizeof got, "%s", flashport_backend_name(be));
        flashport_backend_close(be);
    }
    return got;
}

static void test_backend_env(void)
{
    flashport_status st;
    const char *got;
    setenv("FLASHPORT_BACKEND", "cpu", 1);
    got = opened_name(NULL, &st);
    CHECK_MSG(st == FLASHPORT_OK && strcmp(got, "cpu") == 0, "FLASHPORT_BACKEND=cpu opened '%s'",
              got);
    setenv("FLASHPORT_BACKEND", "reference", 1);
    got = opened_name(NULL, &st);
    CHECK_MSG(st == FLASHPORT_OK && strcmp(got, "reference") == 0,
              "FLASHPORT_BACKEND=reference opened '%s'", got);
    setenv("FLASHPORT_BACKEND", "testdev", 1);
    got = opened_name(NULL, &st);
    CHECK_MSG(st == FLASHPORT_OK && strcmp(got, "testdev") == 0,
              "FLASHPORT_BACKEND=testdev opened '%s' (%s)", got, flashport_last_error());
    /* an explicit name wins over the variable */
    got = opened_name("cpu", &st);
    CHECK_MSG(st == FLASHPORT_OK && strcmp(got, "cpu") == 0, "explicit cpu opened '%s'", got);
    setenv("FLASHPORT_BACKEND", "nonexistent", 1);
    got = opened_name(NULL, &st);
    CHECK_MSG(st == FLASHPORT_ERR_BACKEND_UNKNOWN && contains(flashport_last_error(), "cpu") &&
                  contains(flashport_last_error(), "reference"),
              "FLASHPORT_BACKEND=nonexistent: %s (\"%s\")", flashport_status_string(st),
              flashport_last_error());

    /* auto: the first GPU backend that works, else cpu */
    char avail[256];
    flashport_available_backends(avail, sizeof avail, NULL);
    const char *want = contains(avail, "cuda") ? "cuda" : contains(avail, "hip") ? "hip" : "cpu";
    const char *settings[] = {"auto", "", NULL};
    for (int i = 0; i < 3; i++) {
        if (settings[i])
            setenv("FLASHPORT_BACKEND", settings[i], 1);
        else
            unsetenv("FLASHPORT_BACKEND");
        got = opened_name(NULL, &st);
        CHECK_MSG(st == FLASHPORT_OK && strcmp(got, want) == 0,
                  "FLASHPORT_BACKEND=%s: opened '%s' (%s), expected '%s'",
                  settings[i] ? settings[i] : "(unset)", got, flashport_last_error(), want);
    }
    got = opened_name("auto", &st);
    CHECK_MSG(st == FLASHPORT_OK && strcmp(got, want) == 0, "open(\"auto\") gave '%s'", got);
    printf("auto chose '%s' (available: %s)\n", got, avail);
    unsetenv("FLASHPORT_BACKEND");
}

/* ---- logging, in child processes ----------------------------------------------------------- */

/* What the child does: a little of everything that could print. Exit code 0 when every call
 * returned what it should; the child itself writes nothing. */
static int child_main(void)
{
    int bad = 0;
    static float q[RB * RNQ * RH * RD], k[RB * RNK * RHKV * RD], v[RB * RNK * RHKV * RD];
    static float o[RB * RNQ * RH * RD], lse[RB * RH * RNQ];
    tu_rng r = tu_rng_seed(11);
    fill_ints(q, RB * RNQ * RH * RD, &r);
    fill_ints(k, RB * RNK * RHKV * RD, &r);
    fill_ints(v, RB * RNK * RHKV * RD, &r);
    bad |= forward_on("cpu", q, k, v, o, lse) != FLASHPORT_OK;
    bad |= forward_on("reference", q, k, v, o, lse) != FLASHPORT_OK;
    bad |= forward_on("testdev", q, k, v, o, lse) != FLASHPORT_OK;
    flashport_backend *be;
    bad |= flashport_backend_open("nonexistent", &be) != FLASHPORT_ERR_BACKEND_UNKNOWN;
    bad |= flashport_backend_open("testbroken", &be) != FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    bad |= flashport_backend_open("testnodev", &be) != FLASHPORT_ERR_NO_DEVICE;
    bad |= flashport_backend_open("auto", &be) != FLASHPORT_OK;
    flashport_backend_close(be);
    return bad ? 3 : 0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = (char *)realloc(buf, 2 * cap + 1);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

/* Runs this binary as a child with FLASHPORT_LOG set to `log` (NULL: unset); returns its exit
 * status and its stdout / stderr (malloc'ed). */
static int run_child(const char *self, const char *log, char **out, char **err)
{
    char out_path[128], err_path[128], log_var[64];
    snprintf(out_path, sizeof out_path, "%s/child_stdout", tmp_root);
    snprintf(err_path, sizeof err_path, "%s/child_stderr", tmp_root);
    /* the environment is built before fork: the child may only exec */
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = (char **)calloc(n + 2, sizeof *envp);
    if (!envp)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "FLASHPORT_LOG=", 14) != 0)
            envp[m++] = environ[i];
    if (log) {
        snprintf(log_var, sizeof log_var, "FLASHPORT_LOG=%s", log);
        envp[m++] = log_var;
    }
    envp[m] = NULL;
    int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fo >= 0 && fe >= 0 ? fork() : -1;
    if (pid == 0) {
        char *argv[] = {(char *)self, (char *)"--log-child", NULL};
        if (dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        execve(self, argv, envp);
        _exit(127);
    }
    int status = -1;
    if (pid > 0)
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    if (fo >= 0)
        close(fo);
    if (fe >= 0)
        close(fe);
    free(envp);
    *out = read_file(out_path);
    *err = read_file(err_path);
    unlink(out_path);
    unlink(err_path);
    if (pid < 0)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_logging(const char *self)
{
    const char *quiet[] = {NULL, "0"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, *err = NULL;
        int rc = run_child(self, quiet[i], &out, &err);
        CHECK_MSG(rc == 0, "child (FLASHPORT_LOG=%s) exited with %d; stderr: %s",
                  quiet[i] ? quiet[i] : "(unset)", rc, err ? err : "?");
        CHECK_MSG(out && err && out[0] == '\0' && err[0] == '\0',
                  "FLASHPORT_LOG=%s: the library printed: stdout \"%s\" stderr \"%s\"",
                  quiet[i] ? quiet[i] : "(unset)", out ? out : "?", err ? err : "?");
        free(out);
        free(err);
    }
    char *out = NULL, *err = NULL;
    int rc = run_child(self, "1", &out, &err);
    CHECK_MSG(rc == 0, "child (FLASHPORT_LOG=1) exited with %d; stderr: %s", rc, err ? err : "?");
    if (CHECK(out != NULL && err != NULL)) {
        CHECK_MSG(out[0] == '\0', "FLASHPORT_LOG=1: the library printed to stdout: \"%s\"", out);
        int lines = 0, foreign = 0;
        for (char *line = err; *line;) {
            char *end = strchr(line, '\n');
            size_t len = end ? (size_t)(end - line) : strlen(line);
            lines++;
            if (strncmp(line, "[flashport] ", 12) != 0) {
                foreign++;
                fprintf(stderr, "not a log line: %.*s\n", (int)len, line);
            }
            line += len + (end ? 1 : 0);
        }
        CHECK_MSG(lines >= 5 && foreign == 0, "FLASHPORT_LOG=1: %d lines, %d not log lines", lines,
                  foreign);
        const char *expect[] = {"opened backend 'cpu' on device 0",
                                "forward on 'cpu': f16 B=2 Nq=3 Nk=4 H=4 Hkv=2 D=8",
                                "cpu: decode forward (GQA packing", /* Nq = 3: decode */
                                "reference: naive forward",
                                "opened backend 'testdev' on device 0",
                                "testdev: opened device 0",
                                "testdev: forward (O = q + v[key 0])",
                                "auto: "};
        for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
            CHECK_MSG(contains(err, expect[i]), "FLASHPORT_LOG=1: no log line with \"%s\"",
                      expect[i]);
        printf("FLASHPORT_LOG=1 child wrote %d log lines\n", lines);
    }
    free(out);
    free(err);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--log-child") == 0)
        return child_main();
    if (setup() != 0) {
        fprintf(stderr, "test_plugins: set-up failed in %s: %s\n", tmp_root, strerror(errno));
        teardown();
        return 1;
    }
    unsetenv("FLASHPORT_BACKEND");
    unsetenv("FLASHPORT_DEVICE");
    test_routing();
    test_load_failures();
    test_available_list();
    test_names();
    test_backend_env();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (CHECK(n > 0)) {
        self[n] = '\0';
        test_logging(self);
    }
    teardown();
    return tu_finish("test_plugins", "all checks passed");
}
