/*
 * Hostile plugins: each is refused with a message that names its actual fault, and nothing is
 * ever loaded from the working directory.
 *
 * Refused, through FLASHPORT_PLUGIN_PATH = a temporary folder, then the built test plugins:
 *   garbage        libflashport_garbage.so is text, not ELF       "cannot load <path>: <dlerror>"
 *   missing symbol a shared library without the entry point      "does not export"
 *   NULL ops       OK and no ops table (testnullops)              "returned OK but lacks its ops"
 *   missing entry  ops without forward (testnofwd)                "lacks forward"
 *   wrong name     ops named "someoneelse" (testwrongname)        "registers as backend"
 *   wrong version  ops stamped with another API (testbadver)      "built for plugin API version"
 *                  the entry refuses this core (testoldapi)       "refused to register"
 *   silent refusal the entry fails without a message (testsilent) "no reason given"
 * Each message also lists the available backends, and a very long name is cut so the list still
 * fits. After a successful "auto" open, no earlier failure is left in flashport_last_error().
 *
 * Planted in the working directory: a child process loads a copy of libflashport through a
 * relative name (dlopen("lib/libflashport.so") from folder A, as a relative LD_LIBRARY_PATH
 * would), changes to folder B, whose lib/ holds libflashport_testplanted.so, and opens
 * "testplanted" with FLASHPORT_PLUGIN_PATH unset. The plugin's constructor would create a marker
 * file: the open must fail, the marker must not exist, and the message must name A's absolute
 * lib folder, where the library really is.
 */
#define _GNU_SOURCE

#include "core/backend.h"
#include "tests/test_util.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp_root[64], search_dir[128], plugin_dir[2048];

static const char *libflashport_path(void)
{
    static Dl_info info;
    return dladdr((void *)&flashport_version, &info) && info.dli_fname ? info.dli_fname : NULL;
}

static void expect_refused(const char *name, flashport_status want, const char *needle)
{
    flashport_backend *be = (flashport_backend *)&be;
    flashport_status st = flashport_backend_open(name, &be);
    const char *m = flashport_last_error();
    CHECK_MSG(st == want, "open(%.60s): %s (\"%s\"), expected %s", name,
              flashport_status_string(st), m, flashport_status_string(want));
    CHECK_MSG(strstr(m, needle) != NULL, "open(%.60s): \"%s\" lacks \"%s\"", name, m, needle);
    CHECK_MSG(strstr(m, "available backends: cpu, reference") != NULL,
              "open(%.60s): \"%s\" does not list the available backends", name, m);
    CHECK_MSG(be == NULL, "open(%.60s): *out not reset", name);
    if (st == FLASHPORT_OK)
        flashport_backend_close(be);
}

static void test_refusals(void)
{
    char garbage[192], noentry[192], want[512];
    snprintf(garbage, sizeof garbage, "%s/libflashport_garbage.so", search_dir);
    snprintf(noentry, sizeof noentry, "%s/libflashport_noentry.so", search_dir);
    FILE *f = fopen(garbage, "wb");
    if (!CHECK(f != NULL))
        return;
    for (int i = 0; i < 100; i++)
        fputs("\x7f"
              "ELF? no: garbage bytes where a shared object should be\n",
              f);
    fclose(f);
    if (!CHECK(libflashport_path() && tu_copy_file(libflashport_path(), noentry) == 0))
        return;

    char loads[128]; /* one line per load of a test plugin (tests/plugins/test_plugin.c) */
    snprintf(loads, sizeof loads, "%s/loads", tmp_root);
    setenv("FLASHPORT_TEST_LOADS", loads, 1);
    snprintf(want, sizeof want, "cannot load %s: ", garbage);
    expect_refused("garbage", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
    snprintf(want, sizeof want, "%s does not export %s", noentry, FP_PLUGIN_ENTRY_SYMBOL);
    expect_refused("noentry", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
    for (int round = 0; round < 2; round++) { /* the second answer comes from the registry */
        expect_refused("testnullops", FLASHPORT_ERR_BACKEND_UNAVAILABLE,
                       "returned OK but lacks its ops table");
        expect_refused("testnofwd", FLASHPORT_ERR_BACKEND_UNAVAILABLE,
                       "libflashport_testnofwd.so returned OK but lacks forward");
        expect_refused("testwrongname", FLASHPORT_ERR_BACKEND_UNAVAILABLE,
                       "registers as backend 'someoneelse', not 'testwrongname'");
        snprintf(want, sizeof want, "built for plugin API version %d, core expects %d",
                 FP_PLUGIN_API_VERSION + 7, FP_PLUGIN_API_VERSION);
        expect_refused("testbadver", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
        expect_refused("testoldapi", FLASHPORT_ERR_BACKEND_UNAVAILABLE, "refused to register");
        snprintf(want, sizeof want, "refused to register (plugin API %d): no reason given",
                 FP_PLUGIN_API_VERSION);
        expect_refused("testsilent", FLASHPORT_ERR_BACKEND_UNAVAILABLE, want);
    }
    /* A wrong name is never reported as a version problem, nor a NULL table as a refusal. */
    flashport_backend *be;
    flashport_backend_open("testwrongname", &be);
    CHECK(strstr(flashport_last_error(), "API") == NULL);
    flashport_backend_open("testnullops", &be);
    CHECK(strstr(flashport_last_error(), "refused") == NULL);

    char longname[3000];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    expect_refused(longname, FLASHPORT_ERR_BACKEND_UNKNOWN, "is not a backend name");

    /* "auto" on this machine: no GPU plugin, so cuda and hip fail on the way to cpu. */
    if (CHECK(flashport_backend_open("auto", &be) == FLASHPORT_OK)) {
        CHECK_MSG(flashport_last_error()[0] == '\0', "after auto: stale \"%s\"",
                  flashport_last_error());
        flashport_backend_close(be);
    }
    /* Each refused plugin was dlopened once: the opens after the first, "auto" and the lists of
     * available backends in every message come from the registry. */
    static const char *const refused[] = {"testnullops", "testnofwd",  "testwrongname",
                                          "testbadver",  "testoldapi", "testsilent"};
    char line[64];
    int count[6] = {0};
    f = fopen(loads, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        for (int i = 0; i < 6; i++)
            count[i] += strcmp(line, refused[i]) == 0;
    }
    if (f)
        fclose(f);
    for (int i = 0; i < 6; i++)
        CHECK_MSG(count[i] == 1, "%s was loaded %d times", refused[i], count[i]);
    unsetenv("FLASHPORT_TEST_LOADS");
    unlink(loads);
    unlink(garbage);
    unlink(noentry);
}

/* The child of test_planted: returns 0 when the planted plugin was refused and not loaded. */
static int planted_child(const char *dir_a, const char *dir_b, const char *marker)
{
    char lib_a[512], want[PATH_MAX + 64];
    unsetenv("FLASHPORT_PLUGIN_PATH");
    setenv("FLASHPORT_TEST_MARKER", marker, 1);
    if (chdir(dir_a) != 0)
        return 10;
    void *h = dlopen("lib/libflashport.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "  dlopen lib/libflashport.so: %s\n", dlerror());
        return 11;
    }
    if (chdir(dir_b) != 0)
        return 12;
    /* open_device, not open: the copy's call from open to open_device would bind to the first
     * libflashport of the process, this test's own. */
    flashport_status (*open_fn)(const char *, int, flashport_backend **);
    const char *(*error_fn)(void);
    *(void **)&open_fn = dlsym(h, "flashport_backend_open_device");
    *(void **)&error_fn = dlsym(h, "flashport_last_error");
    if (!open_fn || !error_fn)
        return 13;
    flashport_backend *be = NULL;
    flashport_status st = open_fn("testplanted", 0, &be);
    const char *msg = error_fn();
    int bad = 0;
    if (st == FLASHPORT_OK) {
        fprintf(stderr, "  the planted plugin opened (%s)\n", msg);
        bad = 1;
    }
    if (access(marker, F_OK) == 0) {
        fprintf(stderr, "  the planted plugin's constructor ran\n");
        bad = 1;
    }
    if (!realpath(dir_a, lib_a))
        return 14;
    snprintf(want, sizeof want, "%s/lib/", lib_a);
    if (!strstr(msg, want)) {
        fprintf(stderr, "  message \"%s\" does not name %s\n", msg, want);
        bad = 1;
    }
    return bad;
}

static void test_planted(void)
{
    char dir_a[128], dir_b[128], path[256], marker[192], planted[2200];
    snprintf(dir_a, sizeof dir_a, "%s/a", tmp_root);
    snprintf(dir_b, sizeof dir_b, "%s/b", tmp_root);
    snprintf(marker, sizeof marker, "%s/planted_plugin_ran", tmp_root);
    snprintf(path, sizeof path, "%s/lib", dir_a);
    if (!CHECK(mkdir(dir_a, 0700) == 0 && mkdir(path, 0700) == 0))
        return;
    snprintf(path, sizeof path, "%s/lib/libflashport.so", dir_a);
    if (!CHECK(libflashport_path() && tu_copy_file(libflashport_path(), path) == 0))
        return;
    snprintf(path, sizeof path, "%s/lib", dir_b);
    if (!CHECK(mkdir(dir_b, 0700) == 0 && mkdir(path, 0700) == 0))
        return;
    snprintf(planted, sizeof planted, "%s/libflashport_testplanted.so", plugin_dir);
    snprintf(path, sizeof path, "%s/lib/libflashport_testplanted.so", dir_b);
    if (!CHECK(tu_copy_file(planted, path) == 0))
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(planted_child(dir_a, dir_b, marker));
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "planted plugin in the working directory: child exit status %d", status);
    CHECK_MSG(access(marker, F_OK) != 0, "the planted plugin ran");
    /* Set-up check, after the child (a loaded copy would be inherited): the plugin really
     * leaves its marker when it is loaded, so the check above can fail. */
    setenv("FLASHPORT_TEST_MARKER", marker, 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(h && access(marker, F_OK) == 0, "set-up: the planted plugin leaves no marker");
    unlink(marker);
    snprintf(path, sizeof path, "%s/lib/libflashport.so", dir_a);
    unlink(path);
    snprintf(path, sizeof path, "%s/lib/libflashport_testplanted.so", dir_b);
    unlink(path);
    snprintf(path, sizeof path, "%s/lib", dir_a);
    rmdir(path);
    snprintf(path, sizeof path, "%s/lib", dir_b);
    rmdir(path);
    rmdir(dir_a);
    rmdir(dir_b);
}

int main(void)
{
    const char *env = getenv("FLASHPORT_PLUGIN_PATH");
    snprintf(plugin_dir, sizeof plugin_dir, "%s", env && *env ? env : FLASHPORT_TEST_PLUGIN_DIR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/flashport_hostile_XXXXXX");
    if (!mkdtemp(tmp_root))
        return 1;
    snprintf(search_dir, sizeof search_dir, "%s/search", tmp_root);
    char value[4096];
    snprintf(value, sizeof value, "%s:%s", search_dir, plugin_dir);
    if (mkdir(search_dir, 0700) != 0 || setenv("FLASHPORT_PLUGIN_PATH", value, 1) != 0)
        return 1;
    test_planted(); /* first: it forks */
    test_refusals();
    rmdir(search_dir);
    rmdir(tmp_root);
    return tu_finish("test_hostile_plugins", "all checks passed");
}
