/* kp_valgrind.h: valgrind (memcheck) client requests, built with
 * -DKP_VALGRIND=1 (`make -C csrc valgrind`).
 *
 * With KP_VALGRIND=0, the default, every macro here expands to nothing and
 * no valgrind header is included: the library's code is the same as
 * without this file. With KP_VALGRIND=1 memcheck sees kpool's blocks as it
 * sees malloc's: a use after free (anywhere in the block), a read of bytes
 * never written, an access past a block's usable end, and leaks.
 *
 * Run time: whether the process runs under valgrind is read once, when
 * kpool initialises (RUNNING_ON_VALGRIND, into _kp_vg_on), before any block
 * exists. Every request below is behind that flag, so outside valgrind a
 * KP_VALGRIND=1 build pays one load and a branch not taken at each public
 * call and at each access to a free block's words; no request is executed.
 *
 * What memcheck is told:
 *  - kp_malloc, kp_calloc, kp_realloc, kp_aligned_alloc: MALLOCLIKE_BLOCK of
 *    the block's usable size, kp_usable_size(p) (its class size, or up to the
 *    end of a large block's pages; kpool's API lets a program use those
 *    bytes, so only an access beyond them is an error). The contents are
 *    undefined, except the bytes kp_calloc zeroed. kp_free, kp_free_sized:
 *    FREELIKE_BLOCK, before kpool takes the block back, so that no other
 *    thread can have been handed it in between (valgrind switches threads
 *    between any two blocks of code). A free that memcheck does not know as
 *    a live block (double free, foreign pointer) is reported by memcheck as
 *    an invalid free, and then by kpool as it would be anyway.
 *  - kp_realloc: a small block kept in place keeps its usable size: nothing
 *    changes. A large block resized in place: RESIZEINPLACE_BLOCK from the
 *    old usable size to the new (the common bytes keep their state, new
 *    bytes are undefined, a dropped tail inaccessible). A large block moved
 *    by mremap: memcheck moved the shadow state with the pages; FREELIKE of
 *    the old address, MALLOCLIKE of the new, and the old contents' state is
 *    put back (GET_VBITS before, SET_VBITS after; if no buffer for the bits
 *    can be mapped, the old contents are made defined). Both happen under
 *    the page heap lock, before another thread can be given the pages. A
 *    move by copy is kp_malloc + memcpy + kp_free: memcheck follows it.
 *  - kp_pool: a mempool per pool (CREATE_MEMPOOL at kp_pool_create,
 *    MEMPOOL_ALLOC of block_size at kp_pool_alloc, MEMPOOL_FREE at
 *    kp_pool_free, DESTROY_MEMPOOL at kp_pool_destroy, which also frees the
 *    blocks still live, as kpool does).
 *  - kp_arena: a mempool per arena; MEMPOOL_ALLOC of the size requested
 *    (so an access past it is reported); kp_arena_reset and
 *    kp_arena_destroy: DESTROY_MEMPOOL, every block at once (reset creates
 *    the pool again). Mempools, not MALLOCLIKE, for pools and arenas: their
 *    destroy and reset free every block in one request, and a pool or arena
 *    block given to kp_free is not taken for a heap block.
 *
 * Free blocks (the scheme): after FREELIKE (or MEMPOOL_FREE) the whole block
 * stays inaccessible while kpool holds it, first bytes included, so every
 * use after free is reported. kpool itself reads and writes two words of a
 * free block: the encoded link in word 0 and the free mark in word 1
 * (_kp_next, _kp_set_next, _kp_is_marked, _kp_mark_free, _kp_mark_live in
 * kp_internal.h; mark_free, mark_live, is_free in pool.c). Each of those
 * accesses is wrapped in KP_VG_QUIET_BEGIN/END: memcheck's error reporting
 * is off for the calling thread (the per-thread counter of
 * VALGRIND_DISABLE_ERROR_REPORTING) around that one load or store. Memcheck
 * still performs the access and leaves the shadow state as it was: a store
 * to an inaccessible word changes no shadow bit, and a load from one reads
 * as defined. So the same helpers are correct on any memory: a free block,
 * a slot carved but never handed out, or word 1 of a live block
 * (kp_pool_owns reads it: that value is made defined with
 * KP_VG_DEFINED_VALUE, as a program's word 1 may never have been written).
 * (The other scheme, MAKE_MEM_DEFINED of the two words after each free,
 * would hide a use after free of a block's first 16 bytes.)
 * Memory carved but never handed out: a span the page heap gives to the
 * size classes, a pool or an arena is made inaccessible at once
 * (_kp_pageheap_alloc_aligned), so a read or write of a slot never handed
 * out, or past a block's end into one, is reported too; kpool itself only
 * touches such memory through the quiet helpers, so it causes no report. A
 * large block's span is all of the block: MALLOCLIKE covers it.
 *
 * Leaks: only registered blocks are leak-checked; kpool's metadata and the
 * spans' free memory are mapped pages memcheck does not track as blocks. The
 * pages holding live blocks are mapped memory too, which memcheck scans as
 * roots: a block reached only from another leaked block is reported as
 * reachable rather than indirectly lost (the leaked block that points to
 * it is still reported). Likewise any word of kpool's that happens to hold
 * a block's address makes it reachable: os.c's metadata cursor, one past a
 * metadata chunk, points at the first block of the heap's first span when
 * the kernel placed the two mappings next to each other. A kp_free of a pointer inside a live small block is
 * reported by memcheck as an invalid free; a release build of kpool accepts
 * it (see kpool.h) and may hand out overlapping blocks, which memcheck's
 * leak checker then refuses (it aborts on overlapping blocks).
 */
#ifndef KP_VALGRIND_H
#define KP_VALGRIND_H

#ifndef KP_VALGRIND
#define KP_VALGRIND 0
#endif

#if KP_VALGRIND
#include <valgrind/valgrind.h>
#include <valgrind/memcheck.h>

/* 1 when running under valgrind; set once at initialisation (init.c). */
__attribute__((visibility("hidden"))) extern int _kp_vg_on;

/* stmt runs only under valgrind. */
#define KP_VG(stmt) do { if (__builtin_expect(_kp_vg_on, 0)) { stmt; } } while (0)
/* Around kpool's own access to a free block's words (above). */
#define KP_VG_QUIET_BEGIN() KP_VG(VALGRIND_DISABLE_ERROR_REPORTING)
#define KP_VG_QUIET_END() KP_VG(VALGRIND_ENABLE_ERROR_REPORTING)
/* A value kpool loaded from a block it does not own: defined for memcheck
 * (lvalue v is forced to memory for the request). */
#define KP_VG_DEFINED_VALUE(v) KP_VG(VALGRIND_MAKE_MEM_DEFINED(&(v), sizeof(v)))
#define KP_VG_INIT() (_kp_vg_on = RUNNING_ON_VALGRIND != 0)
#else
#define KP_VG(stmt) ((void)0)
#define KP_VG_QUIET_BEGIN() ((void)0)
#define KP_VG_QUIET_END() ((void)0)
#define KP_VG_DEFINED_VALUE(v) ((void)0)
#define KP_VG_INIT() ((void)0)
#endif

#endif /* KP_VALGRIND_H */
