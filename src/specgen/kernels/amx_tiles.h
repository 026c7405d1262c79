// What linear.c and int4.c share about AMX tiles: the configuration's layout, asking
// Linux for the tiles, putting a thread's tile shapes back after use, and packing the tokens
// into tiles.
#ifndef SPECGEN_AMX_TILES_H
#define SPECGEN_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TILES __attribute__((target("amx-tile,amx-bf16,amx-int8")))
#define TOKENS 16  // columns of a token tile: tokens per group

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

// Whether this process may use the tiles: the CPU has them, and Linux, which hands a process
// the tiles' state only when asked, grants it (asking again is harmless).
static inline int tiles_allowed(void) {
    return __builtin_cpu_supports("amx-tile")
           && !syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
}

// The tiles' shapes are each thread's own state, and the OpenMP threads are shared with the
// other libraries in the process: llama.cpp's AMX kernels set their shapes once per thread
// and crashed when a kernel here released them. So a thread's shapes are put back as they
// were. `config` must be static data, not built on the stack: gcc's _tile_loadconfig tells
// the compiler it reads only the first 8 bytes, and stores to the rest were dropped.
AMX_TILES __attribute__((noinline)) static void tiles_on(tile_config *before,
                                                          const tile_config *config) {
    _tile_storeconfig(before);
    __asm__ volatile("" ::: "memory");  // sttilecfg wrote all 64 bytes, not the 8 gcc assumes
    _tile_loadconfig(config);
}

// Token tiles from x [m rows of row_bytes]: each `step` bytes of a row (the inputs of one tile
// product) become a tile of step / 4 rows by 16 tokens of 4 bytes (bf16 pairs, int8 quads: the
// layout tdpbf16ps and tdpbusd read). xp [groups of 16 tokens][row_bytes / step][step / 4][16],
// zero past the last token.
static void pack_tokens(const uint8_t *x, int m, int row_bytes, int step, uint32_t *xp) {
    int steps = row_bytes / step, units = step / 4, groups = (m + TOKENS - 1) / TOKENS;
    for (int g = 0; g < groups; g++)
        for (int s = 0; s < steps; s++)
            for (int u = 0; u < units; u++)
                for (int t = 0; t < TOKENS; t++) {
                    int token = g * TOKENS + t;
                    uint32_t four = 0;
                    if (token < m) memcpy(&four, x + (int64_t)token * row_bytes + s * step + 4 * u, 4);
                    xp[(((int64_t)g * steps + s) * units + u) * TOKENS + t] = four;
                }
}

AMX_TILES __attribute__((noinline)) static void tiles_off(const tile_config *before) {
    if (before->palette) _tile_loadconfig(before);
    else _tile_release();
}

#endif
