/*
 * Plain driver of the fuzz harness (fuzz_attention.c) for builds without libFuzzer: runs
 * LLVMFuzzerTestOneInput once on every file named on the command line, or in a folder named
 * there (the committed seed corpus, tests/fuzz/corpus, as a CTest), and says how many it ran.
 * A violated property aborts inside the harness; the driver then fails with it.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long ran;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_corpus: cannot open %s\n", path);
        return 1;
    }
    uint8_t buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    ran++;
    return 0;
}

static int names_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of a folder, in name order, so that a run is reproducible. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return run_file(dir);
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 256;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                break;
            names = grown;
        }
        names[count++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, count, sizeof *names, names_cmp);
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        bad |= run_file(path);
        free(names[i]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv)
{
    int bad = 0;
    for (int i = 1; i < argc; i++)
        bad |= run_dir(argv[i]);
    printf("fuzz_corpus: %ld inputs, no property violated\n", ran);
    return bad || ran == 0;
}
