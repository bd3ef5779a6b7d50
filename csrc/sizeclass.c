/* sizeclass.c: the size-class table.
 *
 * Job: map a request size to a class in O(1) (two byte tables) and describe
 * each class: block size, pages per span, objects per span, batch size for
 * thread-cache transfers, longest thread list.
 * Classes: 16-byte steps from 16 B to 1 KiB (every block is 16-byte
 * aligned, so a finer step could not keep that promise), then 8 classes per
 * power of two (steps of at most 12.5%) up to KP_SMALL_MAX (256 KiB), plus
 * one at 1/32 above each power of two from 1 KiB: programs ask for a power
 * of two plus a header (sqlite's 1032- and 4104-byte pages), which the next
 * 1/8 step wasted 11-12% of (sqlite's peak RSS 1.14x glibc's).
 * Invariants (checked by _kp_sizeclass_is_valid): sizes strictly increase;
 *   class(size) is the smallest class whose size >= size; a span wastes at
 *   most 1/32 of its bytes (1/8 cost sqlite's 4368-byte pages 6% more); objects per span <= 512; powers of two up to the
 *   page size are classes (so they are naturally aligned).
 * Calls: nothing. Locks: none (built once under _kp_init's pthread_once).
 */
#include "kp_internal.h"

kp_class_info _kp_classes[KP_NUM_CLASSES];
uint8_t _kp_class_fine[KP_FINE_MAX / KP_FINE_STEP + 1];
uint8_t _kp_class_coarse[KP_SMALL_MAX / KP_COARSE_STEP + 1];

static void describe(unsigned cls, size_t size) {
    kp_class_info *c = &_kp_classes[cls];
    size_t min_objects = size <= 4096 ? 8 : size <= 65536 ? 4 : 2;
    size_t npages = 1;
    for (;; npages++) {
        size_t bytes = npages * KP_PAGE_SIZE;
        size_t objects = bytes / size;
        if (objects >= min_objects && (bytes - objects * size) * 32 <= bytes) break;
    }
    size_t objects = npages * KP_PAGE_SIZE / size;
    if (objects > 512) objects = 512;
    size_t batch = 65536 / size;
    if (batch < 2) batch = 2;
    if (batch > KP_BATCH_MAX) batch = KP_BATCH_MAX;
    c->size = (uint32_t)size;
    c->npages = (uint32_t)npages;
    c->objects = (uint32_t)objects;
    c->batch = (uint32_t)batch;
    c->tcache_max = (uint32_t)(batch * KP_TCACHE_MAX_BATCHES);
    c->tcache_free_max = (uint32_t)(batch * KP_TCACHE_FREE_BATCHES);
    size_t slots = KP_TRANSFER_BYTES / (batch * size);
    c->transfer_slots = (uint32_t)(slots > KP_TRANSFER_SLOTS ? KP_TRANSFER_SLOTS : slots);
    c->recip = (((uint64_t)1 << 32) + size - 1) / size;
}

void _kp_sizeclass_init(void) {
    unsigned cls = 1;
    for (size_t s = KP_FINE_STEP; s <= KP_FINE_MAX; s += KP_FINE_STEP) describe(cls++, s);
    for (size_t base = KP_FINE_MAX; base < KP_SMALL_MAX; base *= 2) {
        describe(cls++, base + base / 32);
        for (size_t k = 1; k <= 8; k++) describe(cls++, base + k * (base / 8));
    }
    kp_assert(cls == KP_NUM_CLASSES);

    unsigned c = 1;
    for (size_t i = 0; i <= KP_FINE_MAX / KP_FINE_STEP; i++) {
        size_t size = i * KP_FINE_STEP;
        while (_kp_classes[c].size < size) c++;
        _kp_class_fine[i] = (uint8_t)c;
    }
    c = 1;
    for (size_t i = 0; i <= KP_SMALL_MAX / KP_COARSE_STEP; i++) {
        size_t size = i * KP_COARSE_STEP;
        while (_kp_classes[c].size < size) c++;
        _kp_class_coarse[i] = (uint8_t)c;
    }
}

int _kp_sizeclass_is_valid(void) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        const kp_class_info *ci = &_kp_classes[c];
        if (ci->size % KP_MIN_ALIGN) return 0;
        if (c > 1 && ci->size <= _kp_classes[c - 1].size) return 0;
        if (c > 1 && c > KP_FINE_MAX / KP_FINE_STEP && (ci->size - _kp_classes[c - 1].size) * 8 > _kp_classes[c - 1].size) return 0;
        if (ci->objects == 0 || ci->objects > 512) return 0;
        if ((size_t)ci->objects * ci->size > (size_t)ci->npages * KP_PAGE_SIZE) return 0;
        if (ci->batch < 2 || ci->batch > KP_BATCH_MAX) return 0;
    }
    for (size_t p = 16; p <= KP_PAGE_SIZE; p *= 2)
        if (_kp_classes[_kp_size_class(p)].size != p) return 0;
    for (size_t s = 0; s <= KP_SMALL_MAX; s++) {
        unsigned c = _kp_size_class(s);
        if (c == 0 || c >= KP_NUM_CLASSES) return 0;
        if (_kp_classes[c].size < s) return 0;
        if (c > 1 && _kp_classes[c - 1].size >= s && s > 0) return 0;
    }
    return 1;
}
